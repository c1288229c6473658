"""Running requests on ``AsyncLLM`` for the routes: several prompts at once, streamed or not,
engine failures mapped to HTTP errors, and client disconnects turned into aborts."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import TypeVar

from fastapi import Request

from prefixcache.engine.async_llm import (
    EngineDeadError,
    EngineRequestError,
    RequestAbortedError,
    RequestInternalError,
)
from prefixcache.engine.outputs import RequestOutput
from prefixcache.engine.sampling_params import SamplingParams
from prefixcache.integrations.server.errors import ApiError
from prefixcache.integrations.server.state import ServerState

T = TypeVar("T")
_DONE = object()


def engine_error(error: BaseException) -> ApiError:
    """The HTTP error for an engine-side failure."""
    if isinstance(error, EngineDeadError):
        return ApiError(503, f"the engine is not running: {error}", code="engine_dead")
    if isinstance(error, RequestAbortedError):  # the server's shutdown deadline passed
        return shutting_down(str(error))
    if isinstance(error, RequestInternalError):  # a step raised on it; the engine goes on
        return ApiError(500, f"the engine failed this request: {error}", code="internal_error")
    if isinstance(error, EngineRequestError):  # the pool cannot hold it (pins since admitted)
        return ApiError(503, f"the request could not complete: {error}",
                        code="kv_cache_exhausted")
    if isinstance(error, (TypeError, ValueError)):
        return ApiError(400, str(error))
    return ApiError(500, f"internal error: {error!r}")


def shutting_down(reason: str) -> ApiError:
    """503 ``server_shutting_down``."""
    return ApiError(503, reason, code="server_shutting_down")


def check_engine_running(state: ServerState) -> None:
    """503 once the server is draining for shutdown (``server_shutting_down``) or the engine
    worker has stopped (``engine_dead``: its command queue is no longer served)."""
    if state.draining:
        raise shutting_down("the server is shutting down; retry on another replica")
    try:
        state.engine.raise_if_dead()
    except EngineDeadError as error:
        raise engine_error(error) from error


async def call_engine(state: ServerState, function: Callable[..., T]) -> T:
    """``AsyncLLM.call`` that answers 503 instead of waiting forever on a stopped engine."""
    check_engine_running(state)
    return await state.engine.call(function)


async def snapshots(
    state: ServerState, token_ids: list[int], params: SamplingParams, salt: str | None,
) -> AsyncIterator[RequestOutput]:
    """One request's cumulative snapshots; its end is recorded in the metrics: its finish, or
    its ``n`` completions as ``abort`` (the client left, the stream was closed) or ``error``
    (the engine failed it)."""
    ended = "abort"
    try:
        async for output in state.engine.generate(token_ids, params, salt=salt):
            if output.finished:
                ended = "finished"
                state.metrics.observe(output)
            yield output
    except (EngineDeadError, EngineRequestError, TypeError, ValueError) as error:
        ended = "error"
        raise engine_error(error) from error
    finally:
        if ended != "finished":
            state.metrics.unfinished(ended, params.n)


async def final_outputs(
    state: ServerState, prompts: Sequence[list[int]], params: SamplingParams, salt: str | None,
) -> list[RequestOutput]:
    """Run every prompt concurrently to its end; results in prompt order. The first prompt
    that fails (or a cancellation) aborts the others, so no request runs on unanswered."""

    async def last(token_ids: list[int]) -> RequestOutput:
        result = None
        async for result in snapshots(state, token_ids, params, salt):  # noqa: B007
            pass
        assert result is not None and result.finished
        return result

    tasks = [asyncio.ensure_future(last(p)) for p in prompts]
    try:
        return list(await asyncio.gather(*tasks))
    except BaseException:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise


async def merged_snapshots(
    state: ServerState, prompts: Sequence[list[int]], params: SamplingParams, salt: str | None,
) -> AsyncIterator[tuple[int, RequestOutput]]:
    """Snapshots of every prompt's request as ``(prompt index, snapshot)``, interleaved.

    Closing this iterator early cancels the per-prompt tasks, which aborts their requests."""
    if len(prompts) == 1:
        async for output in snapshots(state, prompts[0], params, salt):
            yield 0, output
        return
    queue: asyncio.Queue = asyncio.Queue()

    async def pump(index: int, token_ids: list[int]) -> None:
        try:
            async for output in snapshots(state, token_ids, params, salt):
                queue.put_nowait((index, output))
        except BaseException as error:
            queue.put_nowait((index, error))
            raise
        finally:
            queue.put_nowait((index, _DONE))

    tasks = [asyncio.ensure_future(pump(i, p)) for i, p in enumerate(prompts)]
    remaining = len(tasks)
    try:
        while remaining:
            index, item = await queue.get()
            if item is _DONE:
                remaining -= 1
            elif isinstance(item, BaseException):
                raise item
            else:
                yield index, item
    finally:
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(BaseException):
                await task


async def unless_disconnected(request: Request, work: Awaitable[T]) -> T:
    """Await ``work``, cancelling it (and so aborting its requests) if the client leaves."""
    work_task = asyncio.ensure_future(work)

    async def wait_for_disconnect() -> None:
        while True:
            message = await request.receive()
            if message["type"] == "http.disconnect":
                return

    watcher = asyncio.ensure_future(wait_for_disconnect())
    try:
        await asyncio.wait({work_task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
        if not work_task.done():
            work_task.cancel()
    await asyncio.wait({watcher, work_task})  # let the cancelled work queue its aborts
    if work_task.cancelled():
        raise ApiError(499, "the client closed the request", code="client_disconnected")
    return work_task.result()
