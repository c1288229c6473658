"""Typed reads of model config values (HF config.json, GGUF metadata).

Each reader takes the parsed ``source`` mapping, the ``key`` and ``where`` it comes from (e.g.
"config.json") and raises a ValueError naming both when the value has the wrong type or range.
A key that is absent or null takes ``default``; one that is present is always checked, so 0 is
an invalid head count, never a missing one.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

REQUIRED: Any = object()  # `default` for keys that must be present


def _get(source: Mapping[str, Any], key: str, where: str, default: Any) -> Any:
    value = source.get(key)
    if value is None and default is REQUIRED:
        raise ValueError(f"{where} is missing required key {key!r}")
    return value


def _is_int(value: Any) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def _bad(key: str, where: str, expected: str, value: Any) -> ValueError:
    return ValueError(f"{where}: {key} must be {expected}, got {value!r}")


def positive_int(source: Mapping[str, Any], key: str, where: str, default: Any = REQUIRED) -> Any:
    """An int > 0 (``default`` when absent)."""
    value = _get(source, key, where, default)
    if value is None:
        return default
    if not _is_int(value) or value <= 0:
        raise _bad(key, where, "a positive integer", value)
    return int(value)


def non_negative_int(source: Mapping[str, Any], key: str, where: str,
                     default: Any = REQUIRED) -> Any:  # fmt: skip
    """An int >= 0 (``default`` when absent)."""
    value = _get(source, key, where, default)
    if value is None:
        return default
    if not _is_int(value) or value < 0:
        raise _bad(key, where, "an integer >= 0", value)
    return int(value)


def number(source: Mapping[str, Any], key: str, where: str, default: Any = REQUIRED) -> Any:
    """A finite int or float, as a float (``default`` when absent)."""
    value = _get(source, key, where, default)
    if value is None:
        return default
    if not (_is_int(value) or isinstance(value, (float, np.floating))) or not math.isfinite(value):
        raise _bad(key, where, "a finite number", value)
    return float(value)


def flag(source: Mapping[str, Any], key: str, where: str, default: bool) -> bool:
    """A bool (``default`` when absent): "false" as a string would otherwise count as true."""
    value = _get(source, key, where, default)
    if value is None:
        return default
    if not isinstance(value, (bool, np.bool_)):
        raise _bad(key, where, "true or false", value)
    return bool(value)


def text(source: Mapping[str, Any], key: str, where: str, default: Any = REQUIRED) -> Any:
    """A string (``default`` when absent)."""
    value = _get(source, key, where, default)
    if value is None:
        return default
    if not isinstance(value, str):
        raise _bad(key, where, "a string", value)
    return value


def mapping(source: Mapping[str, Any], key: str, where: str) -> Mapping[str, Any]:
    """A JSON object (empty when absent)."""
    value = source.get(key)
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise _bad(key, where, "an object", value)
    return value


def token_id(source: Mapping[str, Any], key: str, where: str) -> int | None:
    """A token id (int >= 0) or None."""
    value = source.get(key)
    if value is None:
        return None
    if not _is_int(value) or value < 0:
        raise _bad(key, where, "a token id (an integer >= 0)", value)
    return int(value)


def token_ids(source: Mapping[str, Any], key: str, where: str) -> tuple[int, ...]:
    """One token id or a list of them, as a tuple (empty when absent)."""
    value = source.get(key)
    if value is None:
        return ()
    values = value if isinstance(value, (list, tuple)) else [value]
    if not all(_is_int(v) and v >= 0 for v in values):
        raise _bad(key, where, "a token id or a list of token ids (integers >= 0)", value)
    return tuple(int(v) for v in values)
