"""``/v1/models``, ``/health``, ``/tokenize``, ``/detokenize`` and ``/metrics``."""

from __future__ import annotations

import time

from fastapi import APIRouter
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST

from prefixcache.integrations.server import protocol as p
from prefixcache.integrations.server import protocol_info as info
from prefixcache.integrations.server.engine_calls import call_engine, check_engine_running
from prefixcache.integrations.server.errors import ApiError, bad_request, error_responses
from prefixcache.integrations.server.prompt_encoding import (
    check_prompt_tokens,
    render_messages,
    tokenize_text,
)
from prefixcache.integrations.server.state import ServerState, State

router = APIRouter()
STARTED = int(time.time())


@router.get("/health", response_model=info.HealthResponse, responses=error_responses(503))
async def health(state: State) -> dict[str, str]:
    """200 while the engine worker runs, 503 once it has stopped."""
    check_engine_running(state)
    return {"status": "ok"}


@router.get("/kv_events", response_model=info.KVEventsInfo, responses=error_responses(404))
async def kv_events(state: State) -> info.KVEventsInfo:
    """The ZeroMQ endpoints of this server's cache events, for a cache-aware router; 404 when
    the server publishes none. A wildcard address (``tcp://*:5557``, ``0.0.0.0``) is the
    caller's to replace with this server's host."""
    llm = state.engine.llm
    publisher = llm.kv_events
    if publisher is None:
        raise ApiError(404, "this server publishes no KV events (start it with --kv-events)",
                       code="kv_events_off")  # fmt: skip
    return info.KVEventsInfo(endpoint=publisher.endpoint,
                             replay_endpoint=publisher.replay_endpoint, topic=publisher.topic,
                             block_size=llm.cache.block_size)  # fmt: skip


def _model_card(state: ServerState) -> info.ModelCard:
    return info.ModelCard(id=state.model_name, created=STARTED, owned_by="prefixcache",
                          max_model_len=state.max_model_len)


@router.get("/v1/models", response_model=info.ModelList)
async def list_models(state: State) -> info.ModelList:
    return info.ModelList(data=[_model_card(state)])


@router.get("/v1/models/{model_id:path}", response_model=info.ModelCard,
            responses=error_responses(404))
async def retrieve_model(model_id: str, state: State) -> info.ModelCard:
    """The served model's card (OpenAI's ``models.retrieve``); 404 for any other id."""
    state.check_model(model_id)
    return _model_card(state)


@router.post("/tokenize", response_model=None, responses={
    200: {"model": info.TokenizeResponse}, **error_responses(400, 404, 413)})
async def tokenize(body: p.TokenizeRequest,
                   state: State) -> JSONResponse:
    """Token ids of ``prompt``, or of ``messages`` rendered by the chat template.

    Text longer than the context is counted too, not refused (as vLLM does): compare
    ``count`` with ``max_model_len``; only text over the server's prompt tokens per request
    is a 400 (before tokenizing when its free lower bound already says so), as is text that
    is not valid Unicode. The answer is written straight to JSON: FastAPI's generic encoding
    of a long id list would hold the event loop for seconds."""
    state.check_model(body.model)
    if (body.prompt is None) == (body.messages is None):
        raise bad_request("give exactly one of prompt or messages", param="prompt")
    param = "prompt" if body.messages is None else "messages"
    text = body.prompt if body.messages is None else await render_messages(state, body.messages)
    check_prompt_tokens(state, state.engine.llm.tokenizer.min_tokens(text), param,
                        at_least=True)
    tokens = await tokenize_text(state, text, param)
    check_prompt_tokens(state, len(tokens), param)
    return JSONResponse({"tokens": tokens, "count": len(tokens),
                         "max_model_len": state.max_model_len})


@router.post("/detokenize", response_model=info.DetokenizeResponse,
             responses=error_responses(400, 404, 413))
async def detokenize(body: p.DetokenizeRequest,
                     state: State) -> dict[str, str]:
    state.check_model(body.model)
    vocab_size = state.engine.llm.config.vocab_size
    bad = [t for t in body.tokens if not 0 <= t < vocab_size]
    if bad:
        raise bad_request(f"token id {bad[0]} is outside the vocabulary [0, {vocab_size})",
                          param="tokens")
    return {"prompt": state.engine.tokenizer.decode(body.tokens, skip_special_tokens=False)}


@router.get("/metrics", response_class=PlainTextResponse, responses={
    200: {"description": "Prometheus text exposition format",
          "content": {"text/plain": {"schema": {"type": "string"}}}},
    **error_responses(503)})
async def metrics(state: State) -> Response:
    """Prometheus text format: cache counters, KV usage, queue sizes, latency histograms."""
    stats = await call_engine(state, lambda llm: llm.stats())
    return Response(state.metrics.render(stats), media_type=CONTENT_TYPE_LATEST)
