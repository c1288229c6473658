"""How applications reach the cache: the CLI, the OpenAI-compatible server, the SDK (clients,
agent ``Session``, RAG middleware), framework adapters and the TTFT benchmark runner.

The SDK names are re-exported lazily, so ``prefixcache.integrations`` stays cheap to import.
"""

from __future__ import annotations

import importlib
from typing import Any

_SDK_NAMES = (
    "AsyncClient",
    "Client",
    "LocalClient",
    "RagMiddleware",
    "RagPromptBuilder",
    "RetrievedChunk",
    "Session",
)

__all__ = list(_SDK_NAMES)


def __getattr__(name: str) -> Any:
    if name in _SDK_NAMES:
        return getattr(importlib.import_module("prefixcache.integrations.sdk"), name)
    raise AttributeError(f"module 'prefixcache.integrations' has no attribute {name!r}")
