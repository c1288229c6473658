"""Build a `tokenizers.Tokenizer` (byte-level BPE) from GGUF `tokenizer.ggml.*` metadata.

A GGUF carries no tokenizer.json: it has the vocabulary, the merges, a token type per id
(3 = control/special, 4 = user-defined), special ids and the name of llama.cpp's
pre-tokenizer (`tokenizer.ggml.pre`). Each supported pre-tokenizer name is mapped to the
splitting the model's original tokenizer.json uses, so ids match Hugging Face exactly.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import lru_cache
from typing import Any

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, processors
from tokenizers import pre_tokenizers as pre

TOKEN_TYPE_CONTROL = 3
TOKEN_TYPE_USER_DEFINED = 4

_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)


def _byte_level() -> pre.PreTokenizer:
    return pre.ByteLevel(add_prefix_space=False, use_regex=True)


def _split_then_bytes(pattern: str) -> pre.PreTokenizer:
    return pre.Sequence([pre.Split(Regex(pattern), behavior="isolated", invert=False),
                         pre.ByteLevel(add_prefix_space=False, use_regex=False)])


def _pre_tokenizer(name: str | None) -> pre.PreTokenizer:
    """Pre-tokenizer for a llama.cpp `tokenizer.ggml.pre` name (ValueError if unknown)."""
    if name in (None, "default", "gpt2", "gpt-2"):
        return _byte_level()
    if name == "smollm":
        # SmolLM / SmolLM2 tokenizer.json: every digit on its own, then GPT-2 byte-level.
        return pre.Sequence([pre.Digits(individual_digits=True), _byte_level()])
    if name in ("llama3", "llama-v3", "llama-bpe", "smaug-bpe", "dbrx", "falcon3"):
        return _split_then_bytes(_LLAMA3_SPLIT)
    if name in ("qwen2", "deepseek-r1-qwen"):
        return _split_then_bytes(_QWEN2_SPLIT)
    raise ValueError(f"unsupported GGUF pre-tokenizer {name!r} (tokenizer.ggml.pre)")


@lru_cache(maxsize=1)
def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character table used by byte-level BPE."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
                 *range(ord("®"), ord("ÿ") + 1)]
    chars = list(printable)
    extra = 0
    for byte in range(256):
        if byte not in printable:
            printable.append(byte)
            chars.append(256 + extra)
            extra += 1
    return {byte: chr(c) for byte, c in zip(printable, chars, strict=True)}


def _byte_level_spelling(token: str, alphabet: frozenset[str]) -> str:
    """A token as byte-level BPE spells it (files occasionally store raw text)."""
    if set(token) <= alphabet:
        return token
    table = bytes_to_unicode()
    return "".join(table[b] for b in token.encode("utf-8"))


def _vocab_entry(token: str, kind: int, alphabet: frozenset[str]) -> str:
    """The BPE vocabulary key of a token of GGUF type `kind`.

    Control (3) and user-defined (4) tokens keep their raw text, which may hold characters
    outside the byte-level alphabet (a space, '▁', '｜'): they are registered as added tokens
    under that text, matched whole in input and returned verbatim by `id_to_token`, as in
    llama.cpp and the original tokenizer.json. Ordinary tokens are spelled byte-level.
    """
    if kind in (TOKEN_TYPE_CONTROL, TOKEN_TYPE_USER_DEFINED):
        return token
    return _byte_level_spelling(token, alphabet)


def tokenizer_from_gguf_metadata(metadata: Mapping[str, Any]) -> Tokenizer:
    """A byte-level BPE `Tokenizer` equivalent to the model's original tokenizer.json.

    Control and user-defined tokens are matched whole under their raw text (see
    `_vocab_entry`). ValueError for a non-BPE or unsupported vocabulary, missing tokens or
    merges, a malformed merge, or a token type list whose length differs from the tokens'.
    """
    model_type = metadata.get("tokenizer.ggml.model")
    if model_type != "gpt2":
        raise ValueError(
            f"unsupported GGUF tokenizer model {model_type!r}: only byte-level BPE ('gpt2') "
            "vocabularies are supported"
        )
    tokens: list[str] = list(metadata.get("tokenizer.ggml.tokens") or [])
    merges_text: list[str] = list(metadata.get("tokenizer.ggml.merges") or [])
    if not tokens or not merges_text:
        raise ValueError("GGUF metadata lacks tokenizer.ggml.tokens or tokenizer.ggml.merges")
    types = list(metadata.get("tokenizer.ggml.token_type") or [1] * len(tokens))
    alphabet = frozenset(bytes_to_unicode().values())
    if len(types) != len(tokens):
        raise ValueError(
            f"GGUF metadata has {len(types)} tokenizer.ggml.token_type entries for "
            f"{len(tokens)} tokens"
        )
    entries = [_vocab_entry(t, kind, alphabet) for t, kind in zip(tokens, types, strict=True)]
    vocab = {token: index for index, token in enumerate(entries)}
    merges = []
    for merge in merges_text:
        parts = merge.split(" ")
        if len(parts) != 2:
            raise ValueError(f"malformed GGUF merge {merge!r}")
        merges.append((parts[0], parts[1]))
    pre_name = metadata.get("tokenizer.ggml.pre")
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False,
                                     byte_fallback=False,
                                     ignore_merges=pre_name in ("llama3", "llama-bpe")))
    if pre_name in ("qwen2", "deepseek-r1-qwen"):
        tokenizer.normalizer = normalizers.NFC()
    tokenizer.pre_tokenizer = _pre_tokenizer(pre_name)
    tokenizer.decoder = decoders.ByteLevel()
    # Special (control) tokens: matched whole in any text, dropped by skip_special_tokens.
    tokenizer.add_special_tokens([
        AddedToken(tokens[i], special=True, normalized=False)
        for i, kind in enumerate(types) if kind == TOKEN_TYPE_CONTROL and tokens[i] in vocab
    ])
    tokenizer.add_tokens([
        AddedToken(tokens[i], special=False, normalized=False)
        for i, kind in enumerate(types) if kind == TOKEN_TYPE_USER_DEFINED and tokens[i] in vocab
    ])
    bos_id = metadata.get("tokenizer.ggml.bos_token_id")
    if metadata.get("tokenizer.ggml.add_bos_token") and bos_id is not None:
        bos = tokens[int(bos_id)]
        tokenizer.post_processor = processors.TemplateProcessing(
            single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, int(bos_id))]
        )
    else:
        tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    return tokenizer
