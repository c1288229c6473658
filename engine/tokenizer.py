"""`Tokenizer`: a thin wrapper on the `tokenizers` library, from tokenizer.json or GGUF."""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from functools import cached_property, lru_cache
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer as BackendTokenizer
from tokenizers import decoders

from .gguf_tokenizer import bytes_to_unicode, tokenizer_from_gguf_metadata
from .incremental_detokenizer import IncrementalDetokenizer

LONG_TEXT_CHARS = 4096  # longer text is encoded with the GIL released (see `encode`)
_SURROGATE = re.compile("[\ud800-\udfff]")
# Pre-tokenizers that keep every byte of the text (each one, or a Sequence of them): only
# with these does a token count bound the text's length. A Split/Punctuation that removes
# its matches does not qualify.
_KEEPING_PRE_TOKENIZERS = frozenset({"ByteLevel", "Split", "Digits", "Punctuation"})


class InvalidTextError(ValueError):
    """Text that is not valid Unicode (a lone UTF-16 surrogate), so it has no UTF-8 bytes
    and cannot be tokenized."""


def check_text(text: str) -> None:
    """InvalidTextError naming the first lone surrogate in ``text`` (JSON ``"\\ud800"``
    decodes to one); no error for valid Unicode."""
    found = _SURROGATE.search(text)
    if found is not None:
        raise InvalidTextError(
            f"the text is not valid Unicode: it contains a lone surrogate "
            f"U+{ord(found.group()):04X} at character {found.start()}"
        )


class Tokenizer:
    """Encode/decode text for one model.

    Contract: `encode(text)` returns exactly the ids Hugging Face's tokenizer returns for the
    same model with `add_special_tokens=False`; special tokens written in the text (e.g.
    `<|im_start|>`) become their single ids. `eos_token_ids` holds every id that ends
    generation.
    """

    def __init__(self, backend: BackendTokenizer, *, eos_token_ids: Iterable[int] = (),
                 bos_token_id: int | None = None) -> None:
        self.backend = backend
        self.eos_token_ids: tuple[int, ...] = tuple(dict.fromkeys(int(i) for i in eos_token_ids))
        self.bos_token_id = bos_token_id

    @classmethod
    def from_file(cls, path: str | Path, *, eos_token_ids: Iterable[int] = (),
                  bos_token_id: int | None = None) -> Tokenizer:
        """Load a Hugging Face `tokenizer.json`."""
        try:
            backend = BackendTokenizer.from_file(str(path))
        except Exception as error:  # tokenizers raises a plain Exception
            raise ValueError(f"cannot load tokenizer from {path}: {error}") from error
        return cls(backend, eos_token_ids=eos_token_ids, bos_token_id=bos_token_id)

    @classmethod
    def from_gguf_metadata(cls, metadata: Mapping[str, Any]) -> Tokenizer:
        """Build from GGUF `tokenizer.ggml.*` metadata (byte-level BPE)."""
        eos = [metadata[key] for key in ("tokenizer.ggml.eos_token_id",
                                         "tokenizer.ggml.eot_token_id") if key in metadata]
        bos = metadata.get("tokenizer.ggml.bos_token_id")
        return cls(tokenizer_from_gguf_metadata(metadata), eos_token_ids=eos,
                   bos_token_id=None if bos is None else int(bos))

    @property
    def decode_concatenates(self) -> bool:
        """Whether decoding ids[:s], when that ends on a complete character (not U+FFFD), then
        ids[s:], and joining the two gives the decoding of all ids: true of byte-level BPE,
        whose decoder maps tokens to bytes and reads them as UTF-8 (GPT-2, Llama 3, Qwen2,
        SmolLM); not of decoders that strip or clean up spaces (SentencePiece-style)."""
        return isinstance(self.backend.decoder, decoders.ByteLevel)

    @property
    def vocab_size(self) -> int:
        """Number of ids including added/special tokens."""
        return self.backend.get_vocab_size(with_added_tokens=True)

    @cached_property
    def max_token_bytes(self) -> int | None:
        """The most UTF-8 bytes of text one token can stand for, or None when the tokenizer
        gives no such bound.

        Known only for byte-level BPE without a normalizer, truncation, a fused unknown token
        or added tokens that strip whitespace: each token then covers exactly the bytes its
        vocabulary entry spells (one byte-alphabet character per byte), or an added token's
        text. Computed once, from the vocabulary."""
        spec = json.loads(self.backend.to_str())
        model, added = spec.get("model") or {}, spec.get("added_tokens") or []
        sound = (
            spec.get("normalizer") is None and spec.get("truncation") is None
            and model.get("type") == "BPE"
            and not (model.get("fuse_unk") and model.get("unk_token") is not None)
            and _keeps_every_byte(spec.get("pre_tokenizer"))
            and not any(token.get("lstrip") or token.get("rstrip") for token in added)
        )
        if not sound:
            return None
        lengths = [len(entry) for entry in model.get("vocab") or {}]
        lengths += [len(token["content"].encode("utf-8", "surrogatepass")) for token in added]
        return max(lengths, default=None)

    def min_tokens(self, text: str) -> int:
        """A lower bound on ``len(self.encode(text))`` that costs no tokenizing: 0 when
        ``max_token_bytes`` is unknown. Sound because a character is at least one byte."""
        bound = self.max_token_bytes
        return 0 if not bound else -(-len(text) // bound)

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        """Token ids of ``text``; InvalidTextError (a ValueError) if it is not valid Unicode.

        Text over ``LONG_TEXT_CHARS`` is encoded through the backend's batch call, which
        releases the GIL (its single-text call holds it throughout: seconds for megabytes),
        so other threads, such as a server's event loop, run meanwhile. Same ids either way."""
        if not isinstance(text, str):
            raise TypeError(f"text must be a str, got {type(text).__name__}")
        try:
            if len(text) > LONG_TEXT_CHARS:
                return self.backend.encode_batch(
                    [text], add_special_tokens=add_special_tokens)[0].ids
            return self.backend.encode(text, add_special_tokens=add_special_tokens).ids
        except TypeError:  # the backend's answer to a lone surrogate
            check_text(text)
            raise

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return self.backend.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def token_to_id(self, token: str) -> int | None:
        return self.backend.token_to_id(token)

    def id_to_token(self, token_id: int) -> str | None:
        return self.backend.id_to_token(token_id)

    def token_bytes(self, token_id: int) -> bytes:
        """The bytes of text ``token_id`` stands for on its own: a byte-level BPE token's
        bytes (a piece of a character, for some), an added or special token's text, else
        the token decoded alone (SentencePiece-style tokenizers)."""
        cached = self._token_bytes.get(token_id)
        if cached is not None:
            return cached
        piece = self.backend.id_to_token(token_id)
        decoder = _byte_decoder()
        if (self.decode_concatenates and piece is not None
                and token_id not in self._added_ids and all(ch in decoder for ch in piece)):
            value = bytes(decoder[ch] for ch in piece)
        else:
            value = self.decode([token_id], skip_special_tokens=False).encode("utf-8")
        self._token_bytes[token_id] = value
        return value

    @cached_property
    def _added_ids(self) -> frozenset[int]:
        return frozenset(self.backend.get_added_tokens_decoder())

    @cached_property
    def _token_bytes(self) -> dict[int, bytes]:
        return {}

    def incremental_detokenizer(self, skip_special_tokens: bool = True) -> IncrementalDetokenizer:
        """A fresh streaming detokenizer over this tokenizer."""
        return IncrementalDetokenizer(
            lambda ids: self.decode(ids, skip_special_tokens=skip_special_tokens)
        )


@lru_cache(maxsize=1)
def _byte_decoder() -> dict[str, int]:
    """Byte-level BPE's printable character -> byte table."""
    return {char: byte for byte, char in bytes_to_unicode().items()}


def _keeps_every_byte(pre_tokenizer: Mapping[str, Any] | None) -> bool:
    """Whether a pre-tokenizer (its tokenizer.json form) maps text to byte-level pieces and
    drops none of it: ByteLevel, alone or in a Sequence of byte-keeping pre-tokenizers."""
    if pre_tokenizer is None:
        return False
    if pre_tokenizer.get("type") == "Sequence":
        members = pre_tokenizer.get("pretokenizers") or []
    else:
        members = [pre_tokenizer]
    keeps = all(m.get("type") in _KEEPING_PRE_TOKENIZERS and m.get("behavior") != "Removed"
                for m in members)
    return keeps and any(m.get("type") == "ByteLevel" for m in members)
