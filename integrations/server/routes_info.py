"""``/v1/models``, ``/health``, ``/tokenize``, ``/detokenize`` and ``/metrics``."""

from __future__ import annotations

import time
from typing import Any

from fastapi import APIRouter
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST

from prefixcache.integrations.server import protocol as p
from prefixcache.integrations.server.engine_calls import call_engine, check_engine_running
from prefixcache.integrations.server.errors import bad_request
from prefixcache.integrations.server.sampling import render_messages, tokenize_text
from prefixcache.integrations.server.state import State

router = APIRouter()
STARTED = int(time.time())


@router.get("/health")
async def health(state: State) -> dict[str, str]:
    """200 while the engine worker runs, 503 once it has stopped."""
    check_engine_running(state)
    return {"status": "ok"}


@router.get("/v1/models")
async def list_models(state: State) -> dict[str, Any]:
    return {
        "object": "list",
        "data": [{
            "id": state.model_name, "object": "model", "created": STARTED,
            "owned_by": "prefixcache", "max_model_len": state.max_model_len,
        }],
    }


@router.post("/tokenize", response_model=None)
async def tokenize(body: p.TokenizeRequest,
                   state: State) -> JSONResponse:
    """Token ids of ``prompt``, or of ``messages`` rendered by the chat template.

    Text longer than the context is counted too, not refused (as vLLM does): compare
    ``count`` with ``max_model_len``. Text that is not valid Unicode is a 400. The answer is
    written straight to JSON: FastAPI's generic encoding of a long id list would hold the
    event loop for seconds."""
    state.check_model(body.model)
    if (body.prompt is None) == (body.messages is None):
        raise bad_request("give exactly one of prompt or messages", param="prompt")
    if body.messages is not None:
        tokens = await tokenize_text(state, render_messages(state, body.messages), "messages")
    else:
        tokens = await tokenize_text(state, body.prompt, "prompt")
    return JSONResponse({"tokens": tokens, "count": len(tokens),
                         "max_model_len": state.max_model_len})


@router.post("/detokenize")
async def detokenize(body: p.DetokenizeRequest,
                     state: State) -> dict[str, str]:
    state.check_model(body.model)
    vocab_size = state.engine.llm.config.vocab_size
    bad = [t for t in body.tokens if not 0 <= t < vocab_size]
    if bad:
        raise bad_request(f"token id {bad[0]} is outside the vocabulary [0, {vocab_size})",
                          param="tokens")
    return {"prompt": state.engine.tokenizer.decode(body.tokens, skip_special_tokens=False)}


@router.get("/metrics")
async def metrics(state: State) -> Response:
    """Prometheus text format: cache counters, KV usage, queue sizes, latency histograms."""
    stats = await call_engine(state, lambda llm: llm.stats())
    return Response(state.metrics.render(stats), media_type=CONTENT_TYPE_LATEST)
