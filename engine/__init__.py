"""The paged decode engine on the prefix cache: ``LLM`` (synchronous) and ``AsyncLLM``."""

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
