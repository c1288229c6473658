"""Cache control: warm (prefill, optionally pin), pin, unpin, lookup, stats, reset.

A prefix is given as ``prompt`` (text or token ids) or chat ``messages`` (rendered with the
chat template, without the final assistant header's effect on earlier blocks).
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query, Request

from prefixcache.engine.sampling_params import SamplingParams
from prefixcache.integrations.server import protocol as p
from prefixcache.integrations.server import protocol_info as info
from prefixcache.integrations.server.engine_calls import (
    call_engine,
    check_engine_running,
    engine_error,
)
from prefixcache.integrations.server.errors import ApiError, bad_request, error_responses
from prefixcache.integrations.server.prompt_encoding import encode_prompt, render_messages
from prefixcache.integrations.server.sampling import check_fits
from prefixcache.integrations.server.state import ServerState, State, resolve_salt

router = APIRouter(prefix="/v1/cache")
PREFIX_ERRORS = error_responses(400, 404, 413, 503)  # a prefix in the body, engine calls


async def _prefix(state: ServerState, request: Request, body: p.CachePromptRequest
                  ) -> tuple[list[int], str | None]:
    state.check_model(body.model)
    if (body.prompt is None) == (body.messages is None):
        raise bad_request("give exactly one of prompt or messages", param="prompt")
    prompt = body.prompt if body.messages is None else await render_messages(state,
                                                                              body.messages)
    token_ids = await encode_prompt(state, prompt,
                                    "prompt" if body.messages is None else "messages")
    return token_ids, resolve_salt(request, body.cache_salt)


def _stats_checked(llm: Any) -> dict[str, Any]:
    llm.cache.check_invariants()
    sliding = getattr(llm, "sliding", None)  # a hybrid KV cache's slot map
    if sliding is not None:
        sliding.check_invariants()
    return llm.stats()


@router.post("/warm", response_model=info.WarmResponse,
             responses=error_responses(400, 404, 413, 429, 500, 503))
async def warm(body: p.WarmRequest, request: Request,
               state: State) -> dict[str, Any]:
    """Prefill the prefix so it is cached (to its last token); ``pin`` keeps it from eviction."""
    token_ids, salt = await _prefix(state, request, body)
    check_fits(state, token_ids, SamplingParams(max_tokens=1), salt)
    check_engine_running(state)
    ticket = state.admission.admit()
    try:
        cached = await state.engine.warm(token_ids, salt=salt, pin=body.pin)
    except (RuntimeError, TypeError, ValueError) as error:
        raise engine_error(error) from error
    finally:
        ticket.release()
    return {"prompt_tokens": len(token_ids), "cached_tokens": cached, "pinned": body.pin}


@router.post("/pin", response_model=info.PinResponse, responses=PREFIX_ERRORS)
async def pin(body: p.CachePromptRequest, request: Request,
              state: State) -> dict[str, Any]:
    """Pin the cached part of the prefix; ``pinned_tokens`` 0 means nothing was cached."""
    token_ids, salt = await _prefix(state, request, body)
    pinned = await call_engine(state, lambda llm: llm.cache.pin(token_ids, salt))
    return {"prompt_tokens": len(token_ids), "pinned_tokens": pinned}


@router.post("/unpin", response_model=info.UnpinResponse, responses=PREFIX_ERRORS)
async def unpin(body: p.CachePromptRequest, request: Request,
                state: State) -> dict[str, Any]:
    """Release the deepest pin on the prefix's cached path (404 if none)."""
    token_ids, salt = await _prefix(state, request, body)
    try:
        await call_engine(state, lambda llm: llm.cache.unpin(token_ids, salt))
    except ValueError as error:
        raise ApiError(404, str(error), param="prompt", code="not_pinned") from error
    return {"prompt_tokens": len(token_ids), "unpinned": True}


@router.post("/lookup", response_model=info.LookupResponse, responses=PREFIX_ERRORS)
async def lookup(body: p.CachePromptRequest, request: Request,
                 state: State) -> dict[str, Any]:
    """How many leading tokens of the prefix are cached now (changes nothing)."""
    token_ids, salt = await _prefix(state, request, body)
    cached = await call_engine(
        state, lambda llm: llm.cache.lookup(token_ids, salt, partial_block=True)
    )
    return {"prompt_tokens": len(token_ids), "cached_tokens": cached}


@router.get("/stats", response_model=info.CacheStats, responses=error_responses(503))
async def stats(state: State) -> dict[str, Any]:
    """Cache and scheduler counters, read between engine steps."""
    return await call_engine(state, _stats_checked)


@router.post("/reset", response_model=info.ResetResponse, responses=error_responses(400, 503))
async def reset(
    state: State,
    host_tier: Annotated[bool, Query(description="Also empty the host-memory KV tier.")] = True,
    disk_tier: Annotated[bool, Query(description="Also delete the disk tier's records.")] = False,
) -> dict[str, Any]:
    """Evict every evictable cached block (in-use and pinned blocks stay); the host-memory
    tier is emptied unless ``host_tier=false``, the disk tier's records deleted only with
    ``disk_tier=true``."""

    def clear(llm: Any) -> int:
        evicted = llm.cache.reset(host_tier=host_tier)
        if disk_tier:
            llm.clear_disk_tier()
        return evicted

    evicted = await call_engine(state, clear)
    return {"evicted_blocks": evicted}
