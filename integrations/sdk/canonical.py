"""Deterministic text for structured values, so equal inputs always give equal tokens.

JSON with sorted keys, fixed separators and no ASCII escaping; text with normalized line
endings and no trailing whitespace. A prefix built from these never changes by accident (dict
order, a stray ``\\r\\n``), which is what keeps it a cache hit.
"""

from __future__ import annotations

import json
from typing import Any


def canonical_json(value: Any) -> str:
    """``value`` as compact JSON with sorted keys (TypeError for non-JSON values)."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                      allow_nan=False)


def canonical_text(text: str) -> str:
    """``\\r\\n`` / ``\\r`` -> ``\\n``, trailing spaces cut per line, outer blank lines cut."""
    lines = text.replace("\r\n", "\n").replace("\r", "\n").split("\n")
    return "\n".join(line.rstrip() for line in lines).strip("\n")
