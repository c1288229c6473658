"""Tokenizer wrapper, GGUF-metadata tokenizer builder and the streaming detokenizer."""

from __future__ import annotations

import json

import pytest
from model_layer_helpers import CORPUS, train_tiny_tokenizer
from tokenizers import pre_tokenizers

from prefixcache.engine.gguf_tokenizer import bytes_to_unicode, tokenizer_from_gguf_metadata
from prefixcache.engine.tokenizer import Tokenizer

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
