"""`Tokenizer`: a thin wrapper on the `tokenizers` library, from tokenizer.json or GGUF."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer as BackendTokenizer
from tokenizers import decoders

from .gguf_tokenizer import tokenizer_from_gguf_metadata
from .incremental_detokenizer import IncrementalDetokenizer


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

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return self.backend.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return self.backend.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def token_to_id(self, token: str) -> int | None:
        return self.backend.token_to_id(token)

    def id_to_token(self, token_id: int) -> str | None:
        return self.backend.id_to_token(token_id)

    def incremental_detokenizer(self, skip_special_tokens: bool = True) -> IncrementalDetokenizer:
        """A fresh streaming detokenizer over this tokenizer."""
        return IncrementalDetokenizer(
            lambda ids: self.decode(ids, skip_special_tokens=skip_special_tokens)
        )
