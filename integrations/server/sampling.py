"""From an OpenAI request's sampling fields to validated ``SamplingParams``.

Every check a client can fail answers 400 with the offending ``param`` named:
``max_tokens`` (or ``max_completion_tokens``) <= 0 or beyond the context, ``n`` out of range,
bad sampling values, a salt the engine refuses, a request too big for the KV pool. Prompts
are turned into token ids by ``prompt_encoding``.
"""

from __future__ import annotations

from collections.abc import Sequence

from prefixcache.engine.sampling_params import SamplingParams
from prefixcache.engine.structured_output import StructuredOutput
from prefixcache.integrations.server.errors import ApiError, bad_request
from prefixcache.integrations.server.prompt_encoding import CONTEXT_CODE, check_texts
from prefixcache.integrations.server.protocol import SamplingFields
from prefixcache.integrations.server.state import ServerState


def sampling_params(
    state: ServerState,
    request: SamplingFields,
    prompt_lengths: Sequence[int],
    max_tokens: int | None,
    default_max_tokens: int | None,
    max_tokens_param: str = "max_tokens",
    structured: StructuredOutput | None = None,
    logprobs: int | None = None,
) -> SamplingParams:
    """Validated params for prompts of ``prompt_lengths`` tokens.

    ``max_tokens`` None means ``default_max_tokens`` clipped to the room left in the context
    and the KV pool (None: all that room). ``max_tokens_param`` is the field the client sent
    it as (chat's ``max_completion_tokens``), named in errors about it. ``structured``: what
    the output must match (``structured_request``); ``logprobs``: top tokens to report beside
    each sampled one (None: no log probabilities)."""
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
        raise bad_request(f"{max_tokens_param} must be >= 1, got {max_tokens}",
                          param=max_tokens_param)
    elif max_tokens > room:
        raise bad_request(
            f"{max_tokens_param}={max_tokens} plus the prompt ({max(prompt_lengths)} tokens) "
            f"exceeds the context length {state.max_model_len}",
            param=max_tokens_param, code=CONTEXT_CODE,
        )
    stop = [request.stop] if isinstance(request.stop, str) else list(request.stop or [])
    check_texts(stop, "stop", "stop")
    try:
        return SamplingParams(
            max_tokens=max_tokens, temperature=request.temperature, top_p=request.top_p,
            top_k=request.top_k, seed=request.seed, n=request.n, stop=stop,
            stop_token_ids=request.stop_token_ids or [], ignore_eos=request.ignore_eos,
            include_stop_str_in_output=request.include_stop_str_in_output,
            presence_penalty=request.presence_penalty,
            frequency_penalty=request.frequency_penalty,
            repetition_penalty=request.repetition_penalty, min_p=request.min_p,
            min_tokens=request.min_tokens, logit_bias=_logit_bias(request.logit_bias),
            structured=structured, logprobs=logprobs,
        )
    except (TypeError, ValueError) as error:
        param = _param_named_in(str(error))
        raise bad_request(str(error),
                          param=max_tokens_param if param == "max_tokens" else param) from error


def check_fits(state: ServerState, token_ids: list[int], params: SamplingParams,
               salt: str | None, max_tokens_param: str = "max_tokens") -> None:
    """400 for a bad salt, a logit bias outside the vocabulary, or a request the KV pool could
    never hold (``max_tokens_param`` names the field to lower)."""
    try:
        state.engine.llm.check_request(token_ids, params, salt)
    except TypeError as error:
        raise bad_request(str(error), param="cache_salt", code="invalid_cache_salt") from error
    except ValueError as error:
        if str(error).startswith("logit_bias"):  # a token id outside the vocabulary
            raise bad_request(str(error), param="logit_bias") from error
        raise ApiError(400, str(error), param=max_tokens_param, code=CONTEXT_CODE) from error


def _logit_bias(bias: dict[str, float] | None) -> dict[int, float]:
    """OpenAI's ``logit_bias`` (token ids as JSON object keys) with int keys; 400 naming
    ``logit_bias`` for a key that is not a token id."""
    result = {}
    for key, value in (bias or {}).items():
        if not (key.isascii() and key.isdigit()):
            raise bad_request(f"logit_bias keys must be token ids, got {key!r}",
                              param="logit_bias")
        result[int(key)] = value
    return result


# "stop_token_ids" before "stop", "min_tokens" before "n"...: messages start with the field
SAMPLING_FIELDS = ("stop_token_ids", "temperature", "max_tokens", "top_p", "top_k", "seed",
                   "stop", "presence_penalty", "frequency_penalty", "repetition_penalty",
                   "min_p", "min_tokens", "logit_bias", "n")


def _param_named_in(message: str) -> str | None:
    for name in SAMPLING_FIELDS:
        if message.startswith(name):
            return name
    return None
