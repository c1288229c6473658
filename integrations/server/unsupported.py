"""OpenAI request fields this server does not honour: refused, not silently dropped.

A client that asks for something and gets an answer without it cannot tell; OpenAI itself
answers 400 naming the parameter when a model does not support one. Unknown fields stay
ignored (clients add their own), and each field here passes at its neutral value, which some
clients send by default (``"best_of": 1``).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

from prefixcache.integrations.server.errors import ApiError, bad_request

UNSUPPORTED_CODE = "unsupported_parameter"


def _absent_or(*neutral: Any) -> Callable[[Any], bool]:
    """Whether a value is None or one of ``neutral``, by type as well as value (``0`` is not
    ``False``: a completion's ``"logprobs": 0`` asks for the sampled token's log probability)."""
    return lambda value: value is None or any(
        type(value) is type(n) and value == n for n in neutral
    )


# field -> whether a value of it asks for nothing this server would leave out
NEUTRAL: dict[str, dict[str, Callable[[Any], bool]]] = {
    "completions": {"suffix": _absent_or(""), "best_of": _absent_or(1)},
    "chat": {},
}


def refuse_unsupported(route: str, extra_fields: Mapping[str, Any] | None) -> None:
    """400 ``unsupported_parameter`` (the field as ``param``) for the first field of a request
    to ``route`` ("completions" or "chat") that asks for something this server does not do."""
    for name, neutral in NEUTRAL[route].items():
        value = (extra_fields or {}).get(name)
        if not neutral(value):
            raise _unsupported(name, value)


def _unsupported(name: str, value: Any) -> ApiError:
    shown = json.dumps(value, default=str)
    if len(shown) > 80:
        shown = shown[:77] + "..."
    return bad_request(f"this server does not support {name!r} (got {shown}); leave it out",
                       param=name, code=UNSUPPORTED_CODE)
