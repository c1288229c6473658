"""Streaming detokenization: turn one token id at a time into text deltas.

Byte-level BPE splits multi-byte UTF-8 characters across tokens; decoding a lone token then
yields U+FFFD. The detokenizer decodes a small window of recent ids and only emits text once
the window ends on a complete character (the offsets scheme used by TGI and vLLM).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

_REPLACEMENT = "\ufffd"

DecodeFn = Callable[[Sequence[int]], str]


class IncrementalDetokenizer:
    """Feed ids with `step`, collect the returned deltas, call `flush` at the end.

    Contract: the concatenation of all deltas plus `flush()` equals `decode(all ids)` for
    byte-level tokenizers; text is never emitted twice.
    """

    def __init__(self, decode: DecodeFn) -> None:
        self._decode = decode
        self._ids: list[int] = []
        self._prefix_offset = 0  # start of the decode window
        self._read_offset = 0  # ids before this have been emitted

    @property
    def token_ids(self) -> list[int]:
        return list(self._ids)

    def step(self, token_id: int) -> str:
        """Add one id; return the newly completed text (possibly "")."""
        self._ids.append(int(token_id))
        prefix_text = self._decode(self._ids[self._prefix_offset : self._read_offset])
        new_text = self._decode(self._ids[self._prefix_offset :])
        if len(new_text) > len(prefix_text) and not new_text.endswith(_REPLACEMENT):
            self._prefix_offset = self._read_offset
            self._read_offset = len(self._ids)
            return new_text[len(prefix_text) :]
        return ""

    def flush(self) -> str:
        """Return any held-back text (an incomplete character shows as U+FFFD)."""
        prefix_text = self._decode(self._ids[self._prefix_offset : self._read_offset])
        new_text = self._decode(self._ids[self._prefix_offset :])
        self._prefix_offset = self._read_offset = len(self._ids)
        return new_text[len(prefix_text) :]
