"""BodyMemo: a request body's token-id prompt parsed by reusing a recent body it starts like.

An agent resends its whole history each turn, so most of a body the router parses now is,
byte for byte, the start of one it parsed moments before. Parsing the 32K token ids of a
150 KB body costs ~0.27 ms (simdjson); comparing its bytes with a remembered body ~0.01 ms.
The memo keeps, for the last ``capacity`` bodies with a prompt of token ids: the bytes, the
prompt's ids, where its array starts and the offset just past each id. A new body sharing
its first ``L`` bytes with one of them takes that body's ids that end before byte ``L``
(their digits and the byte after them are the same bytes, read in the same state, since a
JSON parser's state at a byte depends only on the bytes before it); only the rest of the
array and the other fields are parsed:

* the body with the reused ids replaced by one placeholder id (``[0`` + the rest) is parsed
  once: its ``prompt`` must be a flat list of integers, with no ``[`` before the first ``]``
  after the last reused id (so that ``]`` is the array's own end), and it gives the other
  fields too;
* when a body is first kept, its array is found by replacing it with a sentinel integer,
  which the whole parse must read as the ``prompt``: the array found is the one the whole
  parse reads, and the same bytes lead to it in a body reusing it.

Anything else (a rest that is not plain integers, a body that is no JSON past the shared
bytes) falls back to the whole parse, so ``parse`` returns what the whole parse returns. The
router only routes by what it reads; the bytes it forwards are the client's own.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

Parse = Callable[[bytes], Any]
"""The whole parse: a body's top-level value, a prompt of token ids as an int32 array."""

SENTINEL = -7_306_199_341_893_845_427  # stands in for the prompt array in the other fields
_SENTINEL_TEXT = str(SENTINEL).encode()
_DIGITS = re.compile(rb"[0-9]+")
_KEY = b'"prompt"'
_SPACE = b" \t\r\n"
_WINDOW = 256  # bytes checked before a remembered body is compared whole
_ENOUGH = 4096  # a body sharing all but this many bytes ends the search


@dataclass(eq=False)  # entries are found and dropped by identity
class _Body:
    raw: bytes  # the whole body
    start: int  # offset of the prompt array's "["
    ids: np.ndarray  # [tokens] int32, read-only
    ends: np.ndarray  # [tokens] int32: offset one past each id's last byte, increasing
    others: dict[str, Any]  # every other top-level field, parsed


class BodyMemo:
    """``parse(raw)``: ``whole(raw)``, reusing the ids of a recent body ``raw`` starts like.

    ``whole`` must return a dict whose ``prompt`` is an int32 array for a body whose prompt is
    a flat list of token ids, and a list for one with ids outside int32's range. Bodies whose
    prompt has fewer than ``min_tokens`` ids, or that are over ``max_bytes``, are parsed whole
    and not kept. The dicts returned are fresh, but what they hold may be shared with the
    memo and with other results: read it only.
    """

    def __init__(self, whole: Parse, capacity: int = 8, probes: int = 4,
                 min_tokens: int = 256, max_bytes: int = 16 << 20) -> None:  # fmt: skip
        if capacity < 1 or probes < 1:
            raise ValueError("capacity and probes must be positive")
        self.whole = whole
        self.capacity = capacity
        self.probes = probes
        self.min_tokens = min_tokens
        self.max_bytes = max_bytes
        self._bodies: list[_Body] = []  # most recent last
        self.hits = 0
        self.reused_tokens = 0

    def parse(self, raw: bytes) -> Any:
        found = self._best(raw)
        if found is not None:
            body = self._reuse(raw, *found)
            if body is not None:
                return body
        body = self.whole(raw)
        if isinstance(body, dict):
            self._remember(raw, body)
        return body

    # ------------------------------------------------------------------ reuse
    def _best(self, raw: bytes) -> tuple[_Body, int, int] | None:
        """The remembered body whose ids ``raw`` repeats the most of, how many, and how many
        leading bytes they share (the most recent one, of ``probes``, that leaves at most
        ``_ENOUGH`` bytes to parse ends the search). A body can share more than the best so
        far only if it also has ``raw``'s bytes up to where that one stops: only those that
        have the last ``_WINDOW`` of them are compared whole."""
        best, best_shared, common, tried = None, 0, 0, 0
        for entry in reversed(self._bodies):
            if len(raw) <= entry.start or raw[: entry.start + 1] != entry.raw[: entry.start + 1]:
                continue
            window = max(common + 1 - _WINDOW, 0)
            if best is not None and entry.raw[window : common + 1] != raw[window : common + 1]:
                continue
            this_common = _common_prefix(raw, entry.raw)
            shared = int(np.searchsorted(entry.ends, this_common, "left"))
            if shared > best_shared:
                best, best_shared, common = entry, shared, this_common
            tried += 1
            if tried == self.probes or len(raw) - common <= _ENOUGH:
                break
        return None if best is None else (best, best_shared, common)

    def _reuse(self, raw: bytes, entry: _Body, shared: int, common: int) -> dict[str, Any] | None:
        if common == len(raw) == len(entry.raw):  # resent as it was
            self._touch(entry)
            return self._hit({**entry.others, "prompt": entry.ids}, shared)
        after = int(entry.ends[shared - 1])  # the byte after the last reused id
        close = raw.find(b"]", after)
        if close < 0 or raw.find(b"[", after, close) >= 0:  # that "]" may close a nested list
            return None
        # the reused ids replaced by one placeholder id: one parse gives the array's rest
        # (behind the placeholder) and the other fields
        skeleton = self.whole(raw[: entry.start] + b"[0" + raw[after:])
        rest = _int_array(skeleton)
        if rest is None:  # not plain ids, or no JSON past the shared bytes
            return None
        skeleton.pop("prompt")  # the same bytes lead to it as in ``entry``
        ids = _read_only(np.concatenate([entry.ids[:shared], rest[1:]]))
        ends = np.concatenate([entry.ends[:shared], _number_ends(raw, after, close)])
        if shared == len(entry.ids):  # it extends that body, which is then no use
            self._bodies.remove(entry)
        if len(raw) <= self.max_bytes:
            self._keep(_Body(raw, entry.start, ids, ends, skeleton))
        return self._hit({**skeleton, "prompt": ids}, shared)

    def _hit(self, body: dict[str, Any], shared: int) -> dict[str, Any]:
        self.hits += 1
        self.reused_tokens += shared
        return body

    # ------------------------------------------------------------------ remember
    def _remember(self, raw: bytes, body: dict[str, Any]) -> None:
        """Keep ``body`` (the whole parse of ``raw``) once its prompt array is found in ``raw``:
        the array after a ``"prompt"`` key whose replacement by the sentinel makes the sentinel
        the prompt the whole parse reads (the first top-level ``prompt``)."""
        ids = body.get("prompt")
        if not isinstance(ids, np.ndarray) or len(ids) < self.min_tokens \
                or len(raw) > self.max_bytes:  # fmt: skip
            return
        at = raw.find(_KEY)
        while at >= 0:
            start = _array_start(raw, at + len(_KEY))
            close = raw.find(b"]", start) if start >= 0 else -1
            if close >= 0:
                ends = _number_ends(raw, start + 1, close)
                skeleton = self.whole(raw[:start] + _SENTINEL_TEXT + raw[close + 1 :]) \
                    if len(ends) == len(ids) else None  # fmt: skip
                if isinstance(skeleton, dict) and _is_sentinel(skeleton.pop("prompt", None)):
                    self._keep(_Body(raw, start, _read_only(ids), ends, skeleton))
                    return
            at = raw.find(_KEY, at + 1)

    def _keep(self, entry: _Body) -> None:
        self._bodies.append(entry)
        if len(self._bodies) > self.capacity:
            del self._bodies[0]

    def _touch(self, entry: _Body) -> None:
        self._bodies.remove(entry)
        self._bodies.append(entry)

    def check_invariants(self) -> None:
        assert len(self._bodies) <= self.capacity
        for entry in self._bodies:
            assert len(entry.raw) <= self.max_bytes
            assert entry.raw[entry.start : entry.start + 1] == b"["
            assert len(entry.ends) == len(entry.ids) >= self.min_tokens
            assert not entry.ids.flags.writeable
            assert np.all(np.diff(entry.ends) > 0) and entry.ends[0] > entry.start
            assert entry.ends[-1] <= len(entry.raw) and "prompt" not in entry.others


def _common_prefix(a: bytes, b: bytes) -> int:
    """How many leading bytes ``a`` and ``b`` share (compared 8 bytes at a time)."""
    n = min(len(a), len(b))
    words = n // 8
    wa = np.frombuffer(a, np.uint64, count=words)
    wb = np.frombuffer(b, np.uint64, count=words)
    differ = wa != wb
    first = int(differ.argmax()) if words else 0
    at = first * 8 if words and differ[first] else words * 8
    while at < n and a[at] == b[at]:
        at += 1
    return at


def _number_ends(raw: bytes, begin: int, end: int) -> np.ndarray:  # [numbers] int32
    """Offsets one past each run of digits in ``raw[begin:end]``."""
    if end - begin <= _ENOUGH:  # a few ids: fewer calls than numpy's passes
        found = [match.end() for match in _DIGITS.finditer(raw, begin, end)]
        return np.array(found, dtype=np.int32)
    text = np.frombuffer(raw, np.uint8, count=end - begin, offset=begin)
    digit = (text >= ord("0")) & (text <= ord("9"))
    last = digit.copy()
    last[:-1] &= ~digit[1:]
    return (np.flatnonzero(last) + (begin + 1)).astype(np.int32)


def _array_start(raw: bytes, at: int) -> int:
    """The offset of the ``[`` that follows ``: `` after a key ending at ``at``; -1 if none."""
    while at < len(raw) and raw[at] in _SPACE:
        at += 1
    if raw[at : at + 1] != b":":
        return -1
    at += 1
    while at < len(raw) and raw[at] in _SPACE:
        at += 1
    return at if raw[at : at + 1] == b"[" else -1


def _int_array(body: Any) -> np.ndarray | None:
    prompt = body.get("prompt") if isinstance(body, dict) else None
    return prompt if isinstance(prompt, np.ndarray) else None


def _is_sentinel(value: Any) -> bool:
    return type(value) is int and value == SENTINEL


def _read_only(ids: np.ndarray) -> np.ndarray:
    ids.flags.writeable = False
    return ids
