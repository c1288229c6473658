"""From an OpenAI request to validated engine inputs: token ids and ``SamplingParams``.

Every check a client can fail answers 400 with the offending ``param`` named: prompts over
the context length, text that is not valid Unicode, ``max_tokens`` (or
``max_completion_tokens``) <= 0 or beyond the context, ``n`` out of range, bad sampling
values, a salt the engine refuses, a request too big for the KV pool.

Text is tokenized off the event loop (a long prompt must not stall other requests), after a
free check that refuses text too long to fit whatever its tokens.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from starlette.concurrency import run_in_threadpool

from prefixcache.engine.sampling_params import SamplingParams
from prefixcache.engine.tokenizer import LONG_TEXT_CHARS, InvalidTextError, check_text
from prefixcache.integrations.server.errors import ApiError, bad_request
from prefixcache.integrations.server.protocol import ChatMessage, SamplingFields
from prefixcache.integrations.server.state import ServerState

CONTEXT_CODE = "context_length_exceeded"
UNICODE_CODE = "string_unicode"  # pydantic's code for the same fault in a validated field


async def tokenize_text(state: ServerState, text: str, param: str,
                        where: str | None = None) -> list[int]:
    """Token ids of ``text`` (no length check); 400 ``string_unicode`` for text that is not
    valid Unicode, ``param`` named, the message starting with ``where`` (default ``param``).
    Long text is tokenized in a worker thread (``Tokenizer.encode`` releases the GIL for
    it), so the event loop keeps serving."""
    where = where or param
    encode = state.engine.llm.tokenizer.encode
    try:
        if len(text) <= LONG_TEXT_CHARS:  # quick: no thread hop
            return encode(text)
        return await run_in_threadpool(encode, text)
    except InvalidTextError as error:
        raise bad_request(f"{where}: {error}", param=param, code=UNICODE_CODE) from error
    except (TypeError, ValueError) as error:
        raise bad_request(f"{where}: {error}", param=param) from error


def _context_error(num_tokens: int, state: ServerState, param: str, where: str | None, *,
                   at_least: bool = False) -> ApiError:
    has = f"at least {num_tokens}" if at_least else str(num_tokens)
    return bad_request(
        f"{where or 'the prompt'} has {has} tokens; this model's context length is "
        f"{state.max_model_len} (prompt plus at least one generated token)",
        param=param, code=CONTEXT_CODE,
    )


async def encode_prompt(state: ServerState, prompt: str | Sequence[int], param: str,
                        where: str | None = None) -> list[int]:
    """Token ids of one prompt; 400 (``param`` named; ``where``, e.g. ``prompt[2]``, opens
    the message) for empty, out-of-vocabulary, over-length or invalid Unicode prompts. Text
    that cannot fit (``Tokenizer.min_tokens``) is refused untokenized."""
    llm = state.engine.llm
    if isinstance(prompt, str):
        floor = llm.tokenizer.min_tokens(prompt)
        if floor >= state.max_model_len:
            raise _context_error(floor, state, param, where, at_least=True)
        token_ids = await tokenize_text(state, prompt, param, where)
    else:
        token_ids = list(prompt)
    if len(token_ids) >= state.max_model_len:
        raise _context_error(len(token_ids), state, param, where)
    try:
        return llm.encode(token_ids)
    except (TypeError, ValueError) as error:
        raise bad_request(f"{where}: {error}" if where else str(error), param=param) from error


def render_messages(
    state: ServerState, messages: Sequence[ChatMessage], tools: list[dict[str, Any]] | None = None
) -> str:
    """The chat template's prompt text for ``messages``; 400 if the template refuses them."""
    llm = state.engine.llm
    if llm.chat_template is None:
        raise bad_request(f"model {state.model_name!r} has no chat template; use /v1/completions",
                          param="messages")
    dicts: list[Mapping[str, Any]] = [m.model_dump(exclude_none=True) for m in messages]
    _check_texts(dicts, "messages", "messages")
    _check_texts(tools, "tools", "tools")
    try:
        return llm.chat_template.render(dicts, add_generation_prompt=True, tools=tools)
    except ValueError as error:
        raise bad_request(str(error), param="messages") from error


def _check_texts(value: Any, path: str, param: str) -> None:
    """400 ``string_unicode`` (``param`` named) for the first string inside ``value``
    (nested lists and dicts) that is not valid Unicode; ``path`` locates ``value``."""
    if isinstance(value, str):
        try:
            check_text(value)
        except InvalidTextError as error:
            raise bad_request(f"{path}: {error}", param=param, code=UNICODE_CODE) from error
    elif isinstance(value, Mapping):
        for key, item in value.items():
            _check_texts(key, path, param)
            _check_texts(item, f"{path}.{key}", param)
    elif isinstance(value, list):
        for index, item in enumerate(value):
            _check_texts(item, f"{path}[{index}]", param)


def sampling_params(
    state: ServerState,
    request: SamplingFields,
    prompt_lengths: Sequence[int],
    max_tokens: int | None,
    default_max_tokens: int | None,
    max_tokens_param: str = "max_tokens",
) -> SamplingParams:
    """Validated params for prompts of ``prompt_lengths`` tokens.

    ``max_tokens`` None means ``default_max_tokens`` clipped to the room left in the context
    and the KV pool (None: all that room). ``max_tokens_param`` is the field the client sent
    it as (chat's ``max_completion_tokens``), named in errors about it."""
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
    _check_texts(stop, "stop", "stop")
    try:
        return SamplingParams(
            max_tokens=max_tokens, temperature=request.temperature, top_p=request.top_p,
            top_k=request.top_k, seed=request.seed, n=request.n, stop=stop,
            stop_token_ids=request.stop_token_ids or [], ignore_eos=request.ignore_eos,
            include_stop_str_in_output=request.include_stop_str_in_output,
        )
    except (TypeError, ValueError) as error:
        param = _param_named_in(str(error))
        raise bad_request(str(error),
                          param=max_tokens_param if param == "max_tokens" else param) from error


def check_fits(state: ServerState, token_ids: list[int], params: SamplingParams,
               salt: str | None, max_tokens_param: str = "max_tokens") -> None:
    """400 for a bad salt or a request the KV pool could never hold (``max_tokens_param``
    names the field to lower)."""
    try:
        state.engine.llm.check_request(token_ids, params, salt)
    except TypeError as error:
        raise bad_request(str(error), param="cache_salt", code="invalid_cache_salt") from error
    except ValueError as error:
        raise ApiError(400, str(error), param=max_tokens_param, code=CONTEXT_CODE) from error


def _param_named_in(message: str) -> str | None:
    # "stop_token_ids" before "stop": its messages start with both
    for name in ("stop_token_ids", "temperature", "max_tokens", "top_p", "top_k", "seed",
                 "stop", "n"):
        if message.startswith(name):
            return name
    return None
