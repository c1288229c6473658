"""From a request's prompts (text, token ids, chat messages) to validated token ids.

Every check a client can fail answers 400 with the offending ``param`` named: prompts over
the context length, text that is not valid Unicode, ids outside the vocabulary, more prompts
or more prompt tokens than one request may carry (``RequestLimits``).

Nothing long runs on the event loop: chat messages are rendered, and long text tokenized, on
one of two long-lived prompt threads (``on_prompt_thread``; the tokenizer releases the GIL for
long text; rendering is Python code, which lets the loop in at every switch interval). Text
that cannot fit whatever its tokens (the free bound ``Tokenizer.min_tokens``) is refused
before anything is tokenized.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from prefixcache.engine.tokenizer import LONG_TEXT_CHARS, InvalidTextError, check_text
from prefixcache.integrations.server.errors import ApiError, bad_request
from prefixcache.integrations.server.protocol import ChatMessage
from prefixcache.integrations.server.state import ServerState

CONTEXT_CODE = "context_length_exceeded"
UNICODE_CODE = "string_unicode"  # pydantic's code for the same fault in a validated field
TOO_MANY_PROMPTS_CODE = "too_many_prompts"
TOO_MANY_TOKENS_CODE = "too_many_prompt_tokens"

Prompt = str | Sequence[int]
T = TypeVar("T")
_PROMPT_THREADS = ThreadPoolExecutor(2, thread_name_prefix="prefixcache-prompt")


async def on_prompt_thread(function: Callable[..., T], *args: Any) -> T:
    """``function(*args)`` on one of two long-lived threads (shared by every app in the
    process) while the loop serves other requests. Not anyio's pool (``run_in_threadpool``):
    its up to 40 threads exit after 10 s idle and new ones start under load, and glibc gives
    each new thread a malloc arena (up to 8 per core) that keeps its high-water mark; text
    past the context takes up to 64 MiB to tokenize, so RSS rose with every new thread."""
    return await asyncio.get_running_loop().run_in_executor(
        _PROMPT_THREADS, functools.partial(function, *args))


def _tokenize_now(state: ServerState, text: str, param: str, where: str | None) -> list[int]:
    """Token ids of ``text`` (no length check); 400 ``string_unicode`` for text that is not
    valid Unicode. Runs where it is called: on the loop only for short text."""
    try:
        return state.engine.llm.tokenizer.encode(text)
    except InvalidTextError as error:
        raise bad_request(f"{where or param}: {error}", param=param, code=UNICODE_CODE) from error
    except (TypeError, ValueError) as error:
        raise bad_request(f"{where or param}: {error}", param=param) from error


async def tokenize_text(state: ServerState, text: str, param: str,
                        where: str | None = None) -> list[int]:
    """Token ids of ``text`` (no length check); 400 ``string_unicode`` for text that is not
    valid Unicode, ``param`` named, the message starting with ``where`` (default ``param``).
    Long text is tokenized in a worker thread, so the event loop keeps serving."""
    if len(text) <= LONG_TEXT_CHARS:  # quick: no thread hop
        return _tokenize_now(state, text, param, where)
    return await on_prompt_thread(_tokenize_now, state, text, param, where)


def _context_error(num_tokens: int, state: ServerState, param: str, where: str | None, *,
                   at_least: bool = False) -> ApiError:
    has = f"at least {num_tokens}" if at_least else str(num_tokens)
    return bad_request(
        f"{where or 'the prompt'} has {has} tokens; this model's context length is "
        f"{state.max_model_len} (prompt plus at least one generated token)",
        param=param, code=CONTEXT_CODE,
    )


def check_prompt_tokens(state: ServerState, num_tokens: int, param: str, *,
                        at_least: bool = False) -> None:
    """400 ``too_many_prompt_tokens`` if one request's prompts hold more than the server's
    ``max_prompt_tokens`` (``at_least``: a lower bound, from text not yet tokenized)."""
    limit = state.limits.max_prompt_tokens
    if num_tokens > limit:
        has = f"at least {num_tokens}" if at_least else str(num_tokens)
        raise bad_request(
            f"the request's prompts have {has} tokens; this server takes at most {limit} "
            "prompt tokens per request", param=param, code=TOO_MANY_TOKENS_CODE)


def _floor(state: ServerState, prompt: Prompt, param: str, where: str | None) -> int:
    """The fewest tokens ``prompt`` can have; 400 if even that cannot fit the context."""
    if not isinstance(prompt, str):
        return len(prompt)
    floor = state.engine.llm.tokenizer.min_tokens(prompt)
    if floor >= state.max_model_len:
        raise _context_error(floor, state, param, where, at_least=True)
    return floor


def _encode_now(state: ServerState, prompt: Prompt, param: str, where: str | None) -> list[int]:
    """Token ids of one prompt, validated (context length, vocabulary)."""
    token_ids = _tokenize_now(state, prompt, param, where) if isinstance(prompt, str) else list(
        prompt)
    if len(token_ids) >= state.max_model_len:
        raise _context_error(len(token_ids), state, param, where)
    try:
        return state.engine.llm.encode(token_ids)
    except (TypeError, ValueError) as error:
        raise bad_request(f"{where}: {error}" if where else str(error), param=param) from error


async def encode_prompts(state: ServerState, prompts: Sequence[Prompt],
                         param: str) -> list[list[int]]:
    """Token ids of every prompt of one request, in order; 400 (``param`` named; the message
    opens with ``prompt[i]`` when there are several) for too many prompts, too many prompt
    tokens in all, or a prompt that is empty, over-length, out of the vocabulary or invalid
    Unicode. Both caps are checked before anything is tokenized (with each text's free lower
    bound), the token cap again after. A request with more than ``LONG_TEXT_CHARS``
    characters or ids in all is encoded in a worker thread."""
    limit = state.limits.max_prompts
    if len(prompts) > limit:
        raise bad_request(f"the request has {len(prompts)} prompts; this server takes at most "
                          f"{limit} per request", param=param, code=TOO_MANY_PROMPTS_CODE)
    where = [f"{param}[{i}]" if len(prompts) > 1 else None for i in range(len(prompts))]
    floors = [_floor(state, prompt, param, w) for prompt, w in zip(prompts, where, strict=True)]
    check_prompt_tokens(state, sum(floors), param,
                        at_least=any(isinstance(prompt, str) for prompt in prompts))

    def encode_all() -> list[list[int]]:
        return [_encode_now(state, prompt, param, w)
                for prompt, w in zip(prompts, where, strict=True)]

    size = sum(len(prompt) for prompt in prompts)
    encoded = encode_all() if size <= LONG_TEXT_CHARS else await on_prompt_thread(encode_all)
    check_prompt_tokens(state, sum(map(len, encoded)), param)
    return encoded


async def encode_prompt(state: ServerState, prompt: Prompt, param: str) -> list[int]:
    """``encode_prompts`` of one prompt."""
    (token_ids,) = await encode_prompts(state, [prompt], param)
    return token_ids


def _render_now(state: ServerState, messages: Sequence[ChatMessage],
                tools: list[dict[str, Any]] | None) -> str:
    llm = state.engine.llm
    if llm.chat_template is None:
        raise bad_request(f"model {state.model_name!r} has no chat template; use /v1/completions",
                          param="messages")
    dicts: list[Mapping[str, Any]] = [
        {key: value for key, value in message.items() if value is not None}
        for message in messages
    ]
    check_texts(dicts, "messages", "messages")
    check_texts(tools, "tools", "tools")
    try:
        return llm.chat_template.render(dicts, add_generation_prompt=True, tools=tools)
    except ValueError as error:
        raise bad_request(str(error), param="messages") from error


async def render_messages(state: ServerState, messages: Sequence[ChatMessage],
                          tools: list[dict[str, Any]] | None = None) -> str:
    """The chat template's prompt text for ``messages``, rendered in a worker thread; 400 if
    the model has no template, a text is not valid Unicode, or the template refuses them."""
    return await on_prompt_thread(_render_now, state, messages, tools)


def check_texts(value: Any, path: str, param: str) -> None:
    """400 ``string_unicode`` (``param`` named) for the first string inside ``value``
    (nested lists and dicts) that is not valid Unicode; ``path`` locates ``value``."""
    if isinstance(value, str):
        try:
            check_text(value)
        except InvalidTextError as error:
            raise bad_request(f"{path}: {error}", param=param, code=UNICODE_CODE) from error
    elif isinstance(value, Mapping):
        for key, item in value.items():
            check_texts(key, path, param)
            check_texts(item, f"{path}.{key}", param)
    elif isinstance(value, list):
        for index, item in enumerate(value):
            check_texts(item, f"{path}[{index}]", param)
