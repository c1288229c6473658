"""Tokenizer wrapper, GGUF-metadata tokenizer builder and the streaming detokenizer."""

from __future__ import annotations

import json
import re
import sys
import threading

import pytest
from model_layer_helpers import CORPUS, train_tiny_tokenizer
from tokenizers import AddedToken, pre_tokenizers
from tokenizers import Tokenizer as BackendTokenizer

from prefixcache.engine.gguf_tokenizer import bytes_to_unicode, tokenizer_from_gguf_metadata
from prefixcache.engine.tokenizer import LONG_TEXT_CHARS, InvalidTextError, Tokenizer, check_text

TEXTS = [*CORPUS[:3], "", "  two  spaces", "tab\tnew\nline",
         "ünï 日本 😀👩‍👧 1234", "<|im_start|>x"]


@pytest.fixture(scope="module")
def backend():
    return train_tiny_tokenizer()


def gguf_metadata(backend, pre="default"):
    """The tiny tokenizer as llama.cpp would store it in GGUF metadata."""
    spec = json.loads(backend.to_str())
    by_id = {i: t for t, i in spec["model"]["vocab"].items()}
    by_id.update({a["id"]: a["content"] for a in spec["added_tokens"]})
    tokens = [by_id[i] for i in range(len(by_id))]
    return {
        "tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": pre,
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.merges": [m if isinstance(m, str) else " ".join(m)
                                  for m in spec["model"]["merges"]],
        "tokenizer.ggml.token_type": [3 if i < 3 else 1 for i in range(len(tokens))],
        "tokenizer.ggml.bos_token_id": 1, "tokenizer.ggml.eos_token_id": 2,
    }


def test_from_file_encodes_like_the_backend(tmp_path, backend):
    backend.save(str(tmp_path / "tokenizer.json"))
    tokenizer = Tokenizer.from_file(tmp_path / "tokenizer.json", eos_token_ids=[2, 2, 0])
    assert tokenizer.eos_token_ids == (2, 0)
    assert tokenizer.vocab_size == backend.get_vocab_size()
    for text in TEXTS:
        ids = tokenizer.encode(text)
        assert ids == backend.encode(text, add_special_tokens=False).ids
        assert tokenizer.decode(ids, skip_special_tokens=False) == text
    assert tokenizer.encode("<|im_start|>") == [1]
    assert tokenizer.decode([1, *tokenizer.encode("hi")]) == "hi"


def test_gguf_metadata_tokenizer_equals_original(backend):
    tokenizer = Tokenizer.from_gguf_metadata(gguf_metadata(backend))
    assert tokenizer.eos_token_ids == (2,) and tokenizer.bos_token_id == 1
    for text in TEXTS:
        assert tokenizer.encode(text) == backend.encode(text).ids
        ids = tokenizer.encode(text)
        assert tokenizer.decode(ids) == backend.decode(ids, skip_special_tokens=True)


RAW_SPECIALS = ["<｜begin▁of▁sentence｜>", "<｜User｜>", "<|reserved special|>"]
RAW_USER_DEFINED = ["    ", "<think>"]


def _with_raw_added_tokens(backend):
    """The tiny tokenizer plus special and user-defined tokens whose text lies outside the
    byte-level alphabet (DeepSeek-R1 style), and its GGUF metadata (token types 3 and 4)."""
    original = _copy(backend)
    original.add_special_tokens([AddedToken(t, special=True, normalized=False)
                                 for t in RAW_SPECIALS])
    original.add_tokens([AddedToken(t, special=False, normalized=False)
                         for t in RAW_USER_DEFINED])
    metadata = gguf_metadata(original)
    types = metadata["tokenizer.ggml.token_type"]
    for kind, added in ((3, RAW_SPECIALS), (4, RAW_USER_DEFINED)):
        for token in added:
            types[original.token_to_id(token)] = kind
    return original, metadata


def test_raw_text_special_tokens_encode_to_their_single_id(backend):
    original, metadata = _with_raw_added_tokens(backend)
    tokenizer = Tokenizer.from_gguf_metadata(metadata)
    assert tokenizer.vocab_size == original.get_vocab_size(with_added_tokens=True)
    for token in RAW_SPECIALS + RAW_USER_DEFINED:
        token_id = original.token_to_id(token)
        assert tokenizer.id_to_token(token_id) == token
        assert tokenizer.token_to_id(token) == token_id
        text = f"a{token}b {token}"
        ids = tokenizer.encode(text)
        assert ids == original.encode(text).ids and ids.count(token_id) == 2
        for skip in (True, False):
            assert tokenizer.decode(ids, skip_special_tokens=skip) == original.decode(
                ids, skip_special_tokens=skip)
    for text in TEXTS:
        assert tokenizer.encode(text) == original.encode(text).ids


def test_raw_text_bos_and_qwen2_pre_tokenizer(backend):
    original, metadata = _with_raw_added_tokens(backend)
    bos, user = (original.token_to_id(t) for t in RAW_SPECIALS[:2])
    metadata.update({"tokenizer.ggml.pre": "deepseek-r1-qwen",
                     "tokenizer.ggml.bos_token_id": bos, "tokenizer.ggml.add_bos_token": True})
    tokenizer = Tokenizer.from_gguf_metadata(metadata)
    ids = tokenizer.encode("<｜User｜>hello", add_special_tokens=True)
    assert ids[:2] == [bos, user] and user not in ids[2:]
    decoded = tokenizer.decode(ids, skip_special_tokens=False)
    assert decoded == "".join(RAW_SPECIALS[:2]) + "hello"


def test_token_type_count_must_match_the_vocabulary(backend):
    metadata = gguf_metadata(backend)
    metadata["tokenizer.ggml.token_type"] = metadata["tokenizer.ggml.token_type"][:-1]
    with pytest.raises(ValueError, match="token_type entries for"):
        tokenizer_from_gguf_metadata(metadata)


def test_smollm_pre_tokenizer_splits_digits(backend):
    digits = tokenizer_from_gguf_metadata(gguf_metadata(backend, pre="smollm"))
    pieces = [piece for piece, _ in digits.pre_tokenizer.pre_tokenize_str("ab 2024")]
    assert pieces == ["ab", "Ġ", "2", "0", "2", "4"]


def test_unsupported_gguf_tokenizers_raise(backend):
    with pytest.raises(ValueError, match="unsupported GGUF pre-tokenizer 'mystery'"):
        tokenizer_from_gguf_metadata(gguf_metadata(backend, pre="mystery"))
    with pytest.raises(ValueError, match="only byte-level BPE"):
        tokenizer_from_gguf_metadata({**gguf_metadata(backend), "tokenizer.ggml.model": "llama"})


def test_byte_table_is_gpt2_alphabet():
    table = bytes_to_unicode()
    assert len(table) == 256 and set(table.values()) == set(pre_tokenizers.ByteLevel.alphabet())
    assert table[ord(" ")] == "Ġ" and table[ord("a")] == "a"


def test_incremental_detokenizer_holds_back_split_characters(backend):
    tokenizer = Tokenizer(backend)
    text = "naïve 日本語 😀👩‍👧 done"
    ids = tokenizer.encode(text)
    assert len(ids) > len(text.split())  # multi-byte characters span several tokens
    stream = tokenizer.incremental_detokenizer()
    deltas = [stream.step(i) for i in ids]
    assert "".join(deltas) + stream.flush() == text
    assert all("\ufffd" not in delta for delta in deltas)
    assert "" in deltas  # some step completed no character


def test_incremental_detokenizer_flushes_incomplete_tail(backend):
    tokenizer = Tokenizer(backend)
    ids = tokenizer.encode("😀")
    stream = tokenizer.incremental_detokenizer()
    assert stream.step(ids[0]) == ""
    assert stream.flush() == tokenizer.decode(ids[:1])  # the partial character, as U+FFFD
    assert stream.flush() == ""


def _copy(backend):
    return BackendTokenizer.from_str(backend.to_str())


def test_lone_surrogate_is_a_value_error_naming_it(backend):
    tokenizer = Tokenizer(backend)
    long_text = "x" * (LONG_TEXT_CHARS + 5) + "\udfff"
    for text, named in (("ab\ud800c", "U+D800 at character 2"),
                        (long_text, f"U+DFFF at character {LONG_TEXT_CHARS + 5}")):
        with pytest.raises(InvalidTextError, match=f"lone surrogate {re.escape(named)}"):
            tokenizer.encode(text)
    assert issubclass(InvalidTextError, ValueError)
    check_text("ünï 日本 😀👩‍👧")  # valid text, astral characters included: no error
    with pytest.raises(TypeError, match="text must be a str"):
        tokenizer.encode(b"bytes")


def test_long_text_encodes_to_the_same_ids(backend):
    tokenizer = Tokenizer(backend)
    text = " ".join(TEXTS) * (LONG_TEXT_CHARS // 20)
    assert len(text) > LONG_TEXT_CHARS
    assert tokenizer.encode(text) == backend.encode(text, add_special_tokens=False).ids


def test_long_text_encoding_lets_other_threads_run(backend):
    """The backend's single-text encode holds the GIL throughout; a long text must not
    freeze every other thread (a server's event loop) for the seconds it takes.

    With a switch interval far longer than the lines that start the encode take, a waiting
    thread gets the GIL only when the encoding thread releases it: the waiter runs during
    ``encode`` exactly when the encode lets go of the GIL (a short text's encode, which
    holds it, is the control)."""
    tokenizer = Tokenizer(backend)

    def ran_during_encode(text: str) -> bool:
        go, done = threading.Event(), threading.Event()
        encoding, seen = [False], []

        def waiter() -> None:
            go.wait()
            seen.append(encoding[0])  # the first moment this thread holds the GIL again
            done.wait()

        thread = threading.Thread(target=waiter)
        thread.start()
        interval = sys.getswitchinterval()
        sys.setswitchinterval(5.0)  # seconds: far longer than the few lines below take
        try:
            go.set()  # the waiter wakes and waits for the GIL this thread holds
            encoding[0] = True
            tokenizer.encode(text)
            encoding[0] = False
        finally:
            sys.setswitchinterval(interval)
            done.set()
        thread.join()
        return seen[0]

    assert ran_during_encode(CORPUS[0] * 20_000)  # 1.5 MB
    assert not ran_during_encode(CORPUS[0][:LONG_TEXT_CHARS])


def test_min_tokens_bounds_the_token_count(backend):
    tokenizer = Tokenizer(backend)
    spec = json.loads(backend.to_str())
    longest = max([len(t) for t in spec["model"]["vocab"]]
                  + [len(a["content"].encode()) for a in spec["added_tokens"]])
    assert tokenizer.max_token_bytes == longest
    longest_text = max((tokenizer.decode([i], skip_special_tokens=False)
                        for i in range(tokenizer.vocab_size)), key=lambda t: len(t.encode()))
    for text in [*TEXTS, longest_text * 50, "<|im_start|>" * 40, "😀" * 30, " " * 500]:
        assert tokenizer.min_tokens(text) <= len(tokenizer.encode(text)), text
    assert tokenizer.min_tokens("x" * (longest * 7)) == 7
    for pre in ("smollm", "llama3"):  # Sequence pre-tokenizers that keep every byte
        gguf = Tokenizer.from_gguf_metadata(gguf_metadata(backend, pre=pre))
        assert gguf.max_token_bytes == longest


def test_no_token_bound_where_it_would_not_hold(backend):
    """No bound (min_tokens 0) when one token may stand for unboundedly many characters:
    a normalizer (NFC may merge characters), a pre-tokenizer that drops text, an added
    token that swallows the whitespace around it."""
    nfc = Tokenizer.from_gguf_metadata(gguf_metadata(backend, pre="qwen2"))
    dropping = _copy(backend)
    dropping.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(" ", behavior="removed"), pre_tokenizers.ByteLevel()])
    whitespace = _copy(backend)
    whitespace.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    stripping = _copy(backend)
    stripping.add_tokens([AddedToken("<mask>", lstrip=True)])
    assert len(Tokenizer(stripping).encode(" " * 100 + "<mask>")) == 1  # 106 characters
    for tokenizer in (nfc, Tokenizer(dropping), Tokenizer(whitespace), Tokenizer(stripping)):
        assert tokenizer.max_token_bytes is None
        assert tokenizer.min_tokens("x" * 10_000) == 0
