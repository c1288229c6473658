"""The paged decode engine on the prefix cache: ``LLM`` (synchronous) and ``AsyncLLM``.

The names below load on first use (PEP 562), so a light module of this package (the chat
template, the tokenizer) can be imported without torch: a router needs those alone.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_EXPORTS = {
    "LLM": "prefixcache.engine.llm",
    "AsyncLLM": "prefixcache.engine.async_llm",
    "EngineDeadError": "prefixcache.engine.async_llm",
    "EngineRequestError": "prefixcache.engine.async_llm",
    "RequestAbortedError": "prefixcache.engine.async_llm",
    "RequestInternalError": "prefixcache.engine.async_llm",
    "CompletionOutput": "prefixcache.engine.outputs",
    "RequestOutput": "prefixcache.engine.outputs",
    "SamplingParams": "prefixcache.engine.sampling_params",
}

__all__ = [
    "LLM",
    "AsyncLLM",
    "CompletionOutput",
    "EngineDeadError",
    "EngineRequestError",
    "RequestAbortedError",
    "RequestInternalError",
    "RequestOutput",
    "SamplingParams",
]

if TYPE_CHECKING:
    from prefixcache.engine.async_llm import (
        AsyncLLM,
        EngineDeadError,
        EngineRequestError,
        RequestAbortedError,
        RequestInternalError,
    )
    from prefixcache.engine.llm import LLM
    from prefixcache.engine.outputs import CompletionOutput, RequestOutput
    from prefixcache.engine.sampling_params import SamplingParams


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
