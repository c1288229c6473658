"""From an OpenAI request to validated engine inputs: token ids and ``SamplingParams``.

Every check a client can fail answers 400 with the offending ``param`` named: prompts over
the context length, ``max_tokens`` <= 0 or beyond the context, ``n`` out of range, bad
sampling values, a salt the engine refuses, a request too big for the KV pool.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from prefixcache.engine.sampling_params import SamplingParams
from prefixcache.integrations.server.errors import ApiError, bad_request
from prefixcache.integrations.server.protocol import ChatMessage, SamplingFields
from prefixcache.integrations.server.state import ServerState

CONTEXT_CODE = "context_length_exceeded"


def encode_prompt(state: ServerState, prompt: str | Sequence[int], param: str) -> list[int]:
    """Token ids of one prompt; 400 for empty, out-of-vocabulary or over-length prompts."""
    llm = state.engine.llm
    token_ids = llm.tokenizer.encode(prompt) if isinstance(prompt, str) else list(prompt)
    if len(token_ids) >= state.max_model_len:
        raise bad_request(
            f"the prompt has {len(token_ids)} tokens; this model's context length is "
            f"{state.max_model_len} (prompt plus at least one generated token)",
            param=param, code=CONTEXT_CODE,
        )
    try:
        return llm.encode(token_ids)
    except (TypeError, ValueError) as error:
        raise bad_request(str(error), param=param) from error


def render_messages(
    state: ServerState, messages: Sequence[ChatMessage], tools: list[dict[str, Any]] | None = None
) -> str:
    """The chat template's prompt text for ``messages``; 400 if the template refuses them."""
    llm = state.engine.llm
    if llm.chat_template is None:
        raise bad_request(f"model {state.model_name!r} has no chat template; use /v1/completions",
                          param="messages")
    dicts: list[Mapping[str, Any]] = [m.model_dump(exclude_none=True) for m in messages]
    try:
        return llm.chat_template.render(dicts, add_generation_prompt=True, tools=tools)
    except ValueError as error:
        raise bad_request(str(error), param="messages") from error


def sampling_params(
    state: ServerState,
    request: SamplingFields,
    prompt_lengths: Sequence[int],
    max_tokens: int | None,
    default_max_tokens: int | None,
) -> SamplingParams:
    """Validated params for prompts of ``prompt_lengths`` tokens.

    ``max_tokens`` None means ``default_max_tokens`` clipped to the room left in the context
    and the KV pool (None: all that room)."""
    if not 1 <= request.n <= state.max_n:
        raise bad_request(f"n must be in [1, {state.max_n}], got {request.n}", param="n")
    room = state.max_model_len - max(prompt_lengths)
    if max_tokens is None:
        # unset: the default, clipped to what both the context and the KV pool can hold
        cache = state.engine.llm.cache
        pool_room = cache.num_blocks * cache.block_size - max(prompt_lengths)
        limit = max(1, min(room, pool_room))
        max_tokens = limit if default_max_tokens is None else min(default_max_tokens, limit)
    elif max_tokens <= 0:
        raise bad_request(f"max_tokens must be >= 1, got {max_tokens}", param="max_tokens")
    elif max_tokens > room:
        raise bad_request(
            f"max_tokens={max_tokens} plus the prompt ({max(prompt_lengths)} tokens) exceeds "
            f"the context length {state.max_model_len}",
            param="max_tokens", code=CONTEXT_CODE,
        )
    stop = [request.stop] if isinstance(request.stop, str) else list(request.stop or [])
    try:
        return SamplingParams(
            max_tokens=max_tokens, temperature=request.temperature, top_p=request.top_p,
            top_k=request.top_k, seed=request.seed, n=request.n, stop=stop,
            ignore_eos=request.ignore_eos,
        )
    except (TypeError, ValueError) as error:
        raise bad_request(str(error), param=_param_named_in(str(error))) from error


def check_fits(state: ServerState, token_ids: list[int], params: SamplingParams,
               salt: str | None) -> None:
    """400 for a bad salt or a request the KV pool could never hold."""
    try:
        state.engine.llm.check_request(token_ids, params, salt)
    except TypeError as error:
        raise bad_request(str(error), param="cache_salt", code="invalid_cache_salt") from error
    except ValueError as error:
        raise ApiError(400, str(error), param="max_tokens", code=CONTEXT_CODE) from error


def _param_named_in(message: str) -> str | None:
    for name in ("temperature", "top_p", "top_k", "seed", "stop", "max_tokens", "n"):
        if message.startswith(name):
            return name
    return None
