"""Validation and normalisation of the inputs callers pass: token ids, block ids, salts,
extra keys, priorities and caps."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from prefixcache.eviction_index import MAX_PRIORITY, MIN_PRIORITY

TokenIds = Sequence[int] | np.ndarray
"""A prompt: a list of ints or a 1-D integer numpy array (what an engine holds)."""

ExtraKey = str | bytes | int | float | None
"""One extra namespace key (a LoRA id, a modality tag ...): see ``canonical_extra_keys``."""

CanonicalKeys = tuple[tuple[str, ExtraKey], ...]
"""Extra keys as ``(type tag, plain value)`` pairs: what a namespace is keyed and hashed by."""

_NOT_SEQUENCES = (str, bytes, bytearray, memoryview)
"""Sequences that are not sequences of ids or keys (a str is not a list of characters)."""

MAX_TOKEN_ID = 2**31 - 1

_PLAIN_INTS = frozenset({int})


def as_token_array(token_ids: TokenIds) -> np.ndarray:
    """Return the token ids as a C-contiguous int32 array, copying only when needed.

    Raises TypeError for anything that is not a 1-D sequence of integers (floats, strings,
    bools, nested lists) and ValueError for ids outside [0, 2**31).
    """
    if isinstance(token_ids, np.ndarray):
        array = token_ids
    elif isinstance(token_ids, _NOT_SEQUENCES):
        raise TypeError(f"token_ids must be a sequence of ints, got {type(token_ids).__name__}")
    else:
        array = _list_to_array(token_ids)
        if array.size == 0:
            return np.zeros(0, dtype=np.int32)
    if array.ndim != 1:
        raise TypeError(f"token_ids must be one-dimensional, got shape {array.shape}")
    if array.dtype.kind not in "iu":
        raise TypeError(f"token_ids must be integers, got elements of dtype {array.dtype}")
    if array.size:
        if array.dtype.kind == "i" and int(array.min()) < 0:
            raise ValueError(f"token ids must be >= 0, got {int(array.min())}")
        if array.dtype != np.int32 and int(array.max()) > MAX_TOKEN_ID:
            raise ValueError(f"token ids must be < 2**31, got {int(array.max())}")
    if array.dtype != np.int32:
        array = array.astype(np.int32)
    return np.ascontiguousarray(array)


def _list_to_array(token_ids: Sequence[int]) -> np.ndarray:
    """A list of Python (or numpy) ints -> int64 array; bools and other types -> TypeError,
    ints beyond int64 -> ValueError."""
    if not isinstance(token_ids, Sequence):
        raise TypeError(f"token_ids must be a sequence of ints, got {type(token_ids).__name__}")
    kinds = set(map(type, token_ids))
    if not kinds <= {int} and not all(
        k is not bool and issubclass(k, (int, np.integer)) for k in kinds
    ):
        names = sorted(k.__name__ for k in kinds)
        raise TypeError(f"token ids must be ints, got elements of type {', '.join(names)}")
    try:
        return np.array(token_ids, dtype=np.int64)
    except OverflowError:
        raise ValueError("token ids must be < 2**31, got one beyond 64 bits") from None


def as_block_ids(block_ids: Sequence[int] | np.ndarray, num_blocks: int) -> np.ndarray:
    """Return block ids as a 1-D int32 array after checking each lies in [0, num_blocks).

    Accepts a sequence (list, tuple, range) of ints or numpy integers, or a 1-D integer numpy
    array. Raises TypeError for anything else (bools among the ids, floats, nested or 2-D
    input, sets, strings) and ValueError for an id outside the pool, however large.
    """
    if isinstance(block_ids, np.ndarray):
        array = block_ids
        if array.ndim != 1 or (array.dtype.kind not in "iu" and array.size):  # [] is float64
            raise TypeError(
                "block_ids must be a 1-D array of ints, got "
                f"shape {array.shape} of dtype {array.dtype}"
            )
        if array.dtype != np.int32:
            if array.size and (int(array.min()) < 0 or int(array.max()) >= num_blocks):
                raise _unknown_block(int(array[(array < 0) | (array >= num_blocks)][0]), num_blocks)
            return array.astype(np.int32)
    else:
        array = _ids_to_array(block_ids, num_blocks)
    # int32: a negative id read as uint32 is >= 2**31 > num_blocks, so one max bounds both ends
    if array.size and int(array.view(np.uint32).max()) >= num_blocks:
        raise _unknown_block(int(array[(array < 0) | (array >= num_blocks)][0]), num_blocks)
    return array


def _ids_to_array(block_ids: Sequence[int], num_blocks: int) -> np.ndarray:
    """A sequence of ints -> 1-D int32 array (not yet range-checked). Python ints, the common
    case, take one type scan and one conversion; numpy integers are made Python ints first."""
    if type(block_ids) is not list and (
        isinstance(block_ids, _NOT_SEQUENCES) or not isinstance(block_ids, Sequence)
    ):
        raise TypeError(f"block_ids must be a sequence of ints, got {type(block_ids).__name__}")
    kinds = set(map(type, block_ids))
    if not kinds <= _PLAIN_INTS:
        if not all(k is not bool and issubclass(k, (int, np.integer)) for k in kinds):
            names = ", ".join(sorted(k.__name__ for k in kinds))
            raise TypeError(f"block_ids must be ints, got elements of type {names}")
        block_ids = [int(b) for b in block_ids]
    try:
        return np.array(block_ids, dtype=np.int32)
    except OverflowError:  # beyond int32: no pool has such a block
        bad = next(b for b in block_ids if not -(2**31) <= b < 2**31)
        raise _unknown_block(bad, num_blocks) from None


def _unknown_block(block: int, num_blocks: int) -> ValueError:
    return ValueError(f"unknown block id {block} (pool has blocks 0..{num_blocks - 1})")


def as_block_id(block_id: int, num_blocks: int) -> int:
    """One block id as an int after checking it lies in [0, num_blocks): what ``as_block_ids``
    does for a one-element sequence, without building an array (a decode step checks one).

    Raises TypeError for a non-integer (bools included) and ValueError for an unknown block id.
    """
    if isinstance(block_id, bool) or not isinstance(block_id, (int, np.integer)):
        raise TypeError(f"block_ids must be ints, got {type(block_id).__name__}")
    block = int(block_id)
    if not 0 <= block < num_blocks:
        raise ValueError(f"unknown block id {block} (pool has blocks 0..{num_blocks - 1})")
    return block


def canonical_extra_keys(extra_keys: object) -> CanonicalKeys:
    """Extra namespace keys in the one form that both names a namespace and is hashed.

    ``extra_keys`` is a sequence (a tuple or list; not a str or bytes) of keys, each a str,
    bytes, int (numpy integers too), finite float (numpy floats too) or None. Each becomes
    ``(type tag, plain Python value)``, so keys are equal exactly when their canonical forms
    are: ``1``, ``np.int64(1)`` name one namespace, ``1.0`` another, ``"1"`` a third; and
    the namespace hash (taken over this form) is the same whichever spelling came first.
    Bools are refused (``True == 1`` would make them ambiguous), as are NaN and infinities
    (NaN equals nothing); TypeError / ValueError, naming the key.
    """
    if type(extra_keys) is tuple and not extra_keys:  # the common case: no extra keys
        return ()
    if isinstance(extra_keys, _NOT_SEQUENCES) or not isinstance(extra_keys, Sequence):
        raise TypeError(
            "extra_keys must be a tuple or list of keys, got "
            f"{type(extra_keys).__name__} {extra_keys!r}"
        )
    return tuple(_canonical_key(key) for key in extra_keys)


def _canonical_key(key: object) -> tuple[str, ExtraKey]:
    """One extra key as ``(type tag, plain value)``; see ``canonical_extra_keys``."""
    if key is None:
        return ("none", None)
    if isinstance(key, (bool, np.bool_)):
        raise TypeError(f"extra key {key!r} is a bool, ambiguous with 1 / 0: use an int or str")
    if isinstance(key, (int, np.integer)):
        return ("int", int(key))
    if isinstance(key, (float, np.floating)):
        value = float(key)
        if not math.isfinite(value):
            raise ValueError(f"extra key {key!r} is not a finite float")
        return ("float", value + 0.0)  # -0.0 == 0.0: one namespace, one hash
    if isinstance(key, str):
        return ("str", str.__str__(key))  # a plain str (a subclass may repr differently)
    if isinstance(key, bytes):
        return ("bytes", bytes(key))
    raise TypeError(
        f"extra keys must be str, bytes, int, float or None, got {type(key).__name__} {key!r}"
    )


def check_salt(salt: object) -> None:
    """A cache salt is None (the shared namespace) or a string naming a tenant."""
    if salt is not None and not isinstance(salt, str):
        raise TypeError(f"salt must be a str or None, got {type(salt).__name__}")


def check_block_count(n: object) -> int:
    """Return n as an int after checking it is a non-negative integer (not a bool)."""
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)):
        raise TypeError(f"number of blocks must be an int, got {type(n).__name__}")
    if n < 0:
        raise ValueError(f"number of blocks must be >= 0, got {n}")
    return int(n)


def check_priority(priority: object) -> int:
    """Return ``priority`` after checking it is an int (not a bool) in
    [MIN_PRIORITY, MAX_PRIORITY]: TypeError / ValueError otherwise."""
    if isinstance(priority, bool) or not isinstance(priority, int):
        raise TypeError(f"priority must be an int, got {type(priority).__name__}")
    if not MIN_PRIORITY <= priority <= MAX_PRIORITY:
        raise ValueError(f"priority must be in [{MIN_PRIORITY}, {MAX_PRIORITY}], got {priority}")
    return priority


def check_max_tokens(max_tokens: object) -> int | None:
    """Return ``max_tokens`` as None (no cap) or a Python int >= 0 (numpy integers are
    converted); TypeError for other types (bools, floats, strings), ValueError if negative."""
    if max_tokens is None:
        return None
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, (int, np.integer)):
        raise TypeError(f"max_tokens must be an int or None, got {type(max_tokens).__name__}")
    limit = int(max_tokens)
    if limit < 0:
        raise ValueError(f"max_tokens must be >= 0, got {limit}")
    return limit
