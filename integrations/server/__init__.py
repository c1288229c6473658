"""An OpenAI-compatible HTTP server on ``AsyncLLM``, with cache-control routes and metrics."""

from prefixcache.integrations.server.app import build_app
from prefixcache.integrations.server.background import BackgroundServer

__all__ = ["BackgroundServer", "build_app"]
