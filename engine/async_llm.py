"""AsyncLLM: the engine behind an asyncio API — streaming, aborts, many concurrent requests.

One worker thread owns the ``EngineCore`` (the engine is single-threaded by design); the event
loop talks to it through a command queue, and outputs come back through per-request asyncio
queues. Torch releases the GIL in its kernels, so the loop stays responsive while a step runs.

Built from keyword arguments, the model also loads on that worker thread, so one thread runs
all of the engine's torch work. On CPU this matters: the OpenMP runtime torch uses keeps a
thread pool per thread that ran parallel work, and once the pools together hold more threads
than there are cores, idle pool threads stop spinning and every parallel region (each matmul,
each attention call) first has to wake them. On 2 cores, decoding one sequence: 12.4 ms a token
with one pool, 19.1 ms with a second pool left by loading the model on another thread
(``benchmarks/async_engine.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import queue
import threading
import time
from collections.abc import AsyncIterator, Sequence
from concurrent.futures import Future
from typing import Any

from prefixcache.engine.llm import LLM
from prefixcache.engine.outputs import INTERNAL_ERROR, RequestOutput
from prefixcache.engine.sampling_params import SamplingParams

logger = logging.getLogger(__name__)


class EngineRequestError(RuntimeError):
    """A request the engine accepted could not complete (e.g. the KV pool cannot hold it)."""


class RequestInternalError(EngineRequestError):
    """A step raised on this request (logged with its traceback); it failed alone, its blocks
    were released, and the engine goes on serving the others."""


class RequestAbortedError(EngineRequestError):
    """The request was aborted by ``AsyncLLM.abort_all`` (a server shutting down), not by its
    caller; its blocks were released."""


class EngineDeadError(RuntimeError):
    """The engine worker stopped (shutdown or an internal error); no request can run."""


class AsyncLLM:
    """Streams ``RequestOutput`` snapshots (cumulative text and token ids) per request.

    Build it from keyword arguments for ``LLM`` (the model loads on the engine's worker thread;
    the constructor returns once it is loaded and raises what ``LLM`` raises), or wrap an
    existing ``LLM`` (which must then not be used synchronously at the same time; on CPU, prefer
    the keyword form, see the module docstring).
    """

    def __init__(self, llm: LLM | None = None, **llm_kwargs: Any) -> None:
        self._commands: queue.SimpleQueue[tuple[str, Any]] = queue.SimpleQueue()
        # Each stream runs under an engine id of its own ("<request id>.<serial>"): outputs
        # and aborts of a request that has ended cannot reach a later one reusing its id.
        self._streams: dict[str, tuple[asyncio.AbstractEventLoop, asyncio.Queue]] = {}
        self._engine_ids: dict[str, str] = {}  # running request id -> its engine id
        self._lock = threading.Lock()
        self._ids = itertools.count()
        self._serials = itertools.count()
        self._dead: BaseException | None = None
        self._stopping = False
        loaded: Future[LLM] = Future()
        if llm is not None:
            loaded.set_result(llm)
        self._worker = threading.Thread(
            target=self._run, args=(loaded, llm_kwargs), name="prefixcache-engine", daemon=True
        )
        self._worker.start()
        self.llm = loaded.result()  # raises the loading error (the worker then exits)

    # ------------------------------------------------------------------ public API
    @property
    def tokenizer(self):
        return self.llm.tokenizer

    async def generate(
        self,
        prompt: str | Sequence[int],
        params: SamplingParams | None = None,
        request_id: str | None = None,
        salt: str | None = None,
    ) -> AsyncIterator[RequestOutput]:
        """Yield the request's state after every step that changed it; the last is finished.

        Validation errors raise before anything is queued. Leaving the loop early (a client
        that disconnects, a cancelled task) aborts the request and frees its blocks once the
        generator is closed: at once with ``aclose()`` (or ``contextlib.aclosing``), else when
        the event loop finalizes it (a plain ``break`` leaves it open for a moment). From then
        on its id may be used again, and nothing of the aborted request reaches the new one.
        """
        arrival = time.perf_counter()  # the engine's TTFT and queue time count from here
        params = params or SamplingParams()
        token_ids = self.llm.encode(prompt)
        self.llm.check_request(token_ids, params, salt)
        request_id = request_id or f"async-{next(self._ids)}"
        stream: asyncio.Queue = asyncio.Queue()
        engine_id = f"{request_id}.{next(self._serials)}"
        with self._lock:
            self.raise_if_dead()
            if request_id in self._engine_ids:
                raise ValueError(f"request id {request_id!r} is already running")
            self._engine_ids[request_id] = engine_id
            self._streams[engine_id] = (asyncio.get_running_loop(), stream)
        self._commands.put(
            (
                "add",
                (engine_id, token_ids, params, salt, prompt if isinstance(prompt, str) else None,
                 arrival),
            )
        )
        finished = False
        try:
            while True:
                item = await stream.get()
                if isinstance(item, BaseException):
                    raise item
                if item.error is not None:
                    if item.error_kind == INTERNAL_ERROR:
                        raise RequestInternalError(item.error)
                    raise EngineRequestError(item.error)
                finished = item.finished
                item.request_id = request_id  # a fresh snapshot, this stream's alone
                yield item
                if finished:
                    return
        finally:
            with self._lock:
                self._streams.pop(engine_id, None)
                self._engine_ids.pop(request_id, None)
            if not finished:
                self._commands.put(("abort", engine_id))

    async def abort(self, request_id: str) -> None:
        """Stop a request and free its blocks (no-op if it already finished)."""
        with self._lock:
            engine_id = self._engine_ids.get(request_id)
        if engine_id is not None:
            self._commands.put(("abort", engine_id))

    async def abort_all(self, reason: str) -> int:
        """Abort every request in flight, freeing its blocks; each one's stream raises
        ``RequestAbortedError(reason)``. Returns how many were aborted."""
        return await self.call(lambda llm: self._abort_all_now(reason))

    def _abort_all_now(self, reason: str) -> int:  # on the worker thread
        engine = self.llm.engine
        aborted = list(engine.groups)
        for engine_id in aborted:
            engine.abort(engine_id)
            self._deliver(engine_id, RequestAbortedError(reason))
        return len(aborted)

    def stats(self) -> dict[str, Any]:
        """A snapshot of cache and engine counters (read without stopping the worker)."""
        return self.llm.stats()

    async def call(self, function, *args: Any) -> Any:
        """Run ``function(llm, *args)`` on the worker thread between steps; returns its result.

        For reads and cache edits (stats, pin, reset) that must not race a step. ``function``
        must not step the engine (no ``llm.generate`` / ``llm.warm``: use ``self.warm``)."""
        future = asyncio.get_running_loop().create_future()
        self._commands.put(("call", (future, asyncio.get_running_loop(), function, args)))
        return await future

    async def warm(
        self, prompt: str | Sequence[int], salt: str | None = None, pin: bool = False
    ) -> int:
        """Prefill ``prompt`` (no sampling kept) so it is cached, its partly filled last block
        too; optionally pin it. Returns the prompt tokens cached afterwards."""
        token_ids = self.llm.encode(prompt)
        async for _ in self.generate(
            token_ids, SamplingParams(max_tokens=1, temperature=0.0), salt=salt
        ):
            pass
        if pin:
            return await self.call(lambda llm: llm.cache.pin(token_ids, salt))
        return await self.call(lambda llm: llm.cache.lookup(token_ids, salt, partial_block=True))

    async def pin(self, prompt: str | Sequence[int], salt: str | None = None) -> int:
        """Pin the cached prefix of ``prompt``; returns the pinned tokens (0: none cached)."""
        token_ids = self.llm.encode(prompt)
        return await self.call(lambda llm: llm.cache.pin(token_ids, salt))

    async def unpin(self, prompt: str | Sequence[int], salt: str | None = None) -> None:
        """Release the deepest pin on the cached path of ``prompt`` (ValueError if none)."""
        token_ids = self.llm.encode(prompt)
        await self.call(lambda llm: llm.cache.unpin(token_ids, salt))

    async def reset_cache(self) -> int:
        """Evict every evictable cached block (in-use and pinned blocks stay)."""
        return await self.call(lambda llm: llm.cache.reset())

    def shutdown(self) -> None:
        """Stop the worker; running requests end with EngineDeadError."""
        self._stopping = True
        self._commands.put(("stop", None))
        self._worker.join(timeout=30)

    # ------------------------------------------------------------------ worker thread
    def _run(self, loaded: Future[LLM], llm_kwargs: dict[str, Any]) -> None:
        if not loaded.done():
            try:
                loaded.set_result(LLM(**llm_kwargs))
            except BaseException as error:  # handed to the constructor, which raises it
                loaded.set_exception(error)
                return
        engine = loaded.result().engine
        try:
            while True:
                block = not engine.has_unfinished()
                while True:
                    try:
                        kind, payload = self._commands.get(block=block)
                    except queue.Empty:
                        break
                    if kind == "stop":
                        raise EngineDeadError("the engine was shut down")
                    self._handle(kind, payload)
                    block = not engine.has_unfinished()
                for output in engine.step():
                    self._deliver(output.request_id, output)
        except BaseException as error:  # the worker must report, whatever happened
            if not isinstance(error, EngineDeadError):
                logger.critical("the engine worker stopped", exc_info=error)
            self._dead = (
                error
                if isinstance(error, EngineDeadError)
                else EngineDeadError(f"engine worker failed: {error!r}")
            )
            with self._lock:
                streams = list(self._streams)
            for request_id in streams:
                self._deliver(request_id, self._dead)
        try:  # what the disk tier was handed is written before the worker ends
            loaded.result().flush_tiers()
        except Exception:
            logger.exception("the disk KV tier could not finish its writes")
        loaded.result().close()

    def _handle(self, kind: str, payload: Any) -> None:
        engine = self.llm.engine
        if kind == "add":
            request_id, token_ids, params, salt, prompt, arrival = payload
            try:
                engine.add_request(request_id, token_ids, params, salt, prompt, arrival)
            except Exception as error:  # delivered to the caller, the engine keeps serving
                self._deliver(request_id, error)
        elif kind == "abort":
            final = engine.abort(payload)
            if final is not None:
                self._deliver(payload, final)
        elif kind == "call":
            future, loop, function, args = payload
            try:
                result = function(self.llm, *args)
            except Exception as error:
                loop.call_soon_threadsafe(_settle, future, None, error)
            else:
                loop.call_soon_threadsafe(_settle, future, result, None)

    def _deliver(self, request_id: str, item: RequestOutput | BaseException) -> None:
        with self._lock:
            target = self._streams.get(request_id)
        if target is not None:
            loop, stream = target
            # a closed caller loop raises RuntimeError: nobody is listening any more
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(stream.put_nowait, item)

    def raise_if_dead(self) -> None:
        """EngineDeadError if the worker stopped (shutdown or an internal failure)."""
        if self._dead is not None or self._stopping:
            raise self._dead or EngineDeadError("the engine is shutting down")


def _settle(future: asyncio.Future, result: Any, error: BaseException | None) -> None:
    if future.cancelled():
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)
