"""Deterministic text for structured values, so equal inputs always give equal tokens.

JSON with sorted keys, fixed separators and no ASCII escaping; text with normalized line
endings and no trailing whitespace. A prefix built from these never changes by accident (dict
order, a stray ``\\r\\n``), which is what keeps it a cache hit.
"""

from __future__ import annotations

import json
from typing import Any

JSON_KEY_TYPES = (str, int, float, bool, type(None))


def canonical_json(value: Any) -> str:
    """``value`` as compact JSON with sorted keys.

    Dict keys are first turned into the strings JSON gives them (``10`` -> ``"10"``, ``True``
    -> ``"true"``, ``None`` -> ``"null"``), then sorted as strings, so ``{10: "a", 2: "b"}``
    and ``{"10": "a", "2": "b"}`` serialize alike and mixed key types sort without error.
    Raises TypeError for a value or key JSON cannot represent (a set, a tuple key...),
    ValueError for NaN/infinity, a circular reference, or two keys of one dict that serialize
    to the same string (``{1: .., "1": ..}``)."""
    return json.dumps(_string_keys(value, set()), sort_keys=True, separators=(",", ":"),
                      ensure_ascii=False, allow_nan=False)


def json_key(key: Any) -> str:
    """The string JSON writes for the dict key ``key`` (TypeError if it has none)."""
    if isinstance(key, str):
        return key
    if not isinstance(key, JSON_KEY_TYPES):
        raise TypeError(f"dict keys must be str, int, float, bool or None for JSON, "
                        f"got {type(key).__name__} key {key!r}")
    return json.dumps(key, allow_nan=False)


def _string_keys(value: Any, active: set[int]) -> Any:
    """``value`` with every dict (inside lists and tuples too) keyed by ``json_key``; other
    values are left for ``json.dumps`` to accept or refuse. ``active``: ids of the
    containers being walked, to refuse cycles."""
    if not isinstance(value, dict | list | tuple):
        return value
    if id(value) in active:
        raise ValueError("Circular reference detected")
    active.add(id(value))
    try:
        if not isinstance(value, dict):
            return [_string_keys(item, active) for item in value]
        result: dict[str, Any] = {}
        originals: dict[str, Any] = {}
        for key, item in value.items():
            text = json_key(key)
            if text in originals:
                raise ValueError(f"dict keys {originals[text]!r} and {key!r} both serialize "
                                 f"as the JSON key {text!r}")
            originals[text] = key
            result[text] = _string_keys(item, active)
        return result
    finally:
        active.discard(id(value))


def canonical_text(text: str) -> str:
    """``\\r\\n`` / ``\\r`` -> ``\\n``, trailing spaces cut per line, outer blank lines cut."""
    lines = text.replace("\r\n", "\n").replace("\r", "\n").split("\n")
    return "\n".join(line.rstrip() for line in lines).strip("\n")
