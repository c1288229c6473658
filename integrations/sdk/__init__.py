"""Python SDK: clients for a prefixcache (or any OpenAI-compatible) server or an in-process
``LLM``, an append-only agent ``Session``, and cache-aware RAG prompt building."""

from prefixcache.integrations.sdk.async_http_client import AsyncClient
from prefixcache.integrations.sdk.http_client import Client
from prefixcache.integrations.sdk.local_client import LocalClient
from prefixcache.integrations.sdk.options import GenerationOptions
from prefixcache.integrations.sdk.rag import (
    RagMiddleware,
    RagPromptBuilder,
    RetrievedChunk,
    WarmDocumentsError,
)
from prefixcache.integrations.sdk.results import Chunk, Completion, Usage
from prefixcache.integrations.sdk.session import Session, Turn
from prefixcache.integrations.sdk.wire import APIError, APITimeoutError

__all__ = [
    "APIError",
    "APITimeoutError",
    "AsyncClient",
    "Chunk",
    "Client",
    "Completion",
    "GenerationOptions",
    "LocalClient",
    "RagMiddleware",
    "RagPromptBuilder",
    "RetrievedChunk",
    "Session",
    "Turn",
    "Usage",
    "WarmDocumentsError",
]
