"""The app factory: an OpenAI-compatible FastAPI app in front of one ``AsyncLLM``.

``build_app(engine, ...)`` does not own the engine: whoever built it shuts it down (the
``serve`` command does so when uvicorn stops).
"""

from __future__ import annotations

import secrets

from fastapi import FastAPI, Request
from starlette.middleware.base import BaseHTTPMiddleware, RequestResponseEndpoint
from starlette.responses import Response

from prefixcache.engine.async_llm import AsyncLLM
from prefixcache.engine.tool_calls import TOOL_CALL_PARSERS, parser_for_template
from prefixcache.integrations.server import routes_cache, routes_info, routes_openai
from prefixcache.integrations.server.admission import Admission
from prefixcache.integrations.server.body_limit import BodyLimitMiddleware
from prefixcache.integrations.server.errors import ApiError, error_response, install_error_handlers
from prefixcache.integrations.server.limits import RequestLimits
from prefixcache.integrations.server.metrics import ServerMetrics
from prefixcache.integrations.server.openapi_contract import contract_openapi
from prefixcache.integrations.server.state import ServerState

OPEN_PATHS = frozenset({"/health"})


class ApiKeyMiddleware(BaseHTTPMiddleware):
    """Every route but /health needs ``Authorization: Bearer <key>`` (or ``X-API-Key``)."""

    def __init__(self, app, api_key: str) -> None:
        super().__init__(app)
        self._key = api_key.encode()

    async def dispatch(self, request: Request, call_next: RequestResponseEndpoint) -> Response:
        if request.url.path in OPEN_PATHS:
            return await call_next(request)
        given = request.headers.get("x-api-key")
        authorization = request.headers.get("authorization", "")
        if authorization.lower().startswith("bearer "):
            given = authorization[7:].strip()
        if given is None or not secrets.compare_digest(given.encode(), self._key):
            return error_response(ApiError(401, "invalid or missing API key",
                                           code="invalid_api_key"))
        return await call_next(request)


def build_app(
    engine: AsyncLLM,
    *,
    model_name: str | None = None,
    api_key: str | None = None,
    max_pending: int = 256,
    max_n: int = 16,
    max_body_bytes: int | None = None,
    max_prompts: int | None = None,
    max_prompt_tokens: int | None = None,
    tool_call_parser: str = "auto",
) -> FastAPI:
    """An app serving ``engine`` under ``model_name`` (default: the engine's model name).

    ``tool_call_parser``: the format the model writes tool calls in (``TOOL_CALL_PARSERS``),
    or "auto": the one its chat template shows (hermes when it shows none: the fallback
    template's). ValueError for another name.

    ``max_pending``: requests in flight before new ones get 429. ``max_n``: the largest ``n``.
    ``max_prompts``, ``max_prompt_tokens``, ``max_body_bytes``: one request's limits (None:
    the defaults of ``RequestLimits.for_model`` for the engine's context length).
    """
    template = engine.llm.chat_template
    if tool_call_parser == "auto":
        tool_call_parser = parser_for_template(template.source if template else None)
    elif tool_call_parser not in TOOL_CALL_PARSERS:
        raise ValueError(f"unknown tool call parser {tool_call_parser!r}; choose from auto, "
                         f"{', '.join(TOOL_CALL_PARSERS)}")  # fmt: skip
    limits = RequestLimits.for_model(
        engine.llm.max_model_len, max_prompts=max_prompts, max_prompt_tokens=max_prompt_tokens,
        max_body_bytes=max_body_bytes)
    app = FastAPI(title="prefixcache", version="0.1.0")
    metrics = ServerMetrics()
    app.state.server = ServerState(
        engine=engine,
        model_name=model_name or engine.llm.model_name,
        api_key=api_key,
        max_n=max_n,
        admission=Admission(max_pending, on_reject=metrics.rejected.inc),
        metrics=metrics,
        limits=limits,
        tool_call_parser=tool_call_parser,
    )
    install_error_handlers(app)
    for module in (routes_openai, routes_info, routes_cache):
        app.include_router(module.router)
    app.openapi = contract_openapi(app, OPEN_PATHS, requires_key=bool(api_key),
                                   stream_chunks=routes_openai.STREAM_CHUNKS)
    app.add_middleware(BodyLimitMiddleware, max_bytes=limits.max_body_bytes)
    if api_key:
        app.add_middleware(ApiKeyMiddleware, api_key=api_key)
    return app
