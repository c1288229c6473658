"""Validation and normalisation of the inputs callers pass: token ids, block ids, salts."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

TokenIds = Sequence[int] | np.ndarray
"""A prompt: a list of ints or a 1-D integer numpy array (what an engine holds)."""

MAX_TOKEN_ID = 2**31 - 1


def as_token_array(token_ids: TokenIds) -> np.ndarray:
    """Return the token ids as a C-contiguous int32 array, copying only when needed.

    Raises TypeError for anything that is not a 1-D sequence of integers (floats, strings,
    bools, nested lists) and ValueError for ids outside [0, 2**31).
    """
    if isinstance(token_ids, np.ndarray):
        array = token_ids
    elif isinstance(token_ids, (str, bytes, bytearray)):
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
    """Return block ids as an int32 array after checking each lies in [0, num_blocks).

    Raises TypeError for non-integer input and ValueError for unknown block ids.
    """
    if isinstance(block_ids, (str, bytes, bytearray)) or not hasattr(block_ids, "__len__"):
        raise TypeError(f"block_ids must be a sequence of ints, got {type(block_ids).__name__}")
    array = np.asarray(block_ids) if len(block_ids) else np.zeros(0, dtype=np.int32)
    if array.ndim != 1 or array.dtype.kind not in "iu":
        raise TypeError(f"block_ids must be a 1-D sequence of ints, got dtype {array.dtype}")
    if array.size and (int(array.min()) < 0 or int(array.max()) >= num_blocks):
        bad = array[(array < 0) | (array >= num_blocks)][0]
        raise ValueError(f"unknown block id {int(bad)} (pool has blocks 0..{num_blocks - 1})")
    return array.astype(np.int32, copy=False)


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
