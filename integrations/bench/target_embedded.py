"""The in-process target: an ``AsyncLLM`` on its own ``LLM``, prefix caching on or off."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from prefixcache.integrations.bench.bench_request import BenchRequest
from prefixcache.integrations.bench.request_result import RequestResult
from prefixcache.integrations.bench.runner import TargetSetupError

WARMUP_FIRST_TOKEN = 100  # the warm-up prompt's ids start here (past most special tokens)


def model_vocab_size(model: str) -> int:
    """The vocabulary size in ``model``'s configuration, read without loading its weights
    (config.json of a folder, the metadata of a .gguf). Raises ``TargetSetupError`` (a
    ValueError) with ``describe_load_error``'s message for any failure."""
    from prefixcache.engine.model_registry import describe_load_error, resolve_model
    from prefixcache.engine.weights import GGUFFile, read_hf_config

    try:
        resolved = resolve_model(model)
        if resolved.kind == "gguf":
            return int(GGUFFile(resolved.path).config.vocab_size)
        return int(read_hf_config(resolved.path).vocab_size)
    except Exception as error:
        raise TargetSetupError(describe_load_error(model, error)) from error


class EmbeddedTarget:
    """Builds its engine in ``start`` and drops it in ``close`` (one model in memory at a
    time when targets run one after another). Greedy sampling, EOS ignored: every request
    generates exactly ``max_tokens`` tokens."""

    kind = "embedded"

    def __init__(self, model: str, cache_on: bool, label: str | None = None, **llm_kwargs: Any):
        self.model = model
        self.cache_on = cache_on
        self.label = label or f"cache {'on' if cache_on else 'off'}"
        self.llm_kwargs = llm_kwargs
        self.engine: Any = None
        self.peak_kv_usage: float | None = None
        self.final_stats: dict[str, Any] = {}
        self.setup_error: str | None = None

    @property
    def model_name(self) -> str:
        return self.model

    async def start(self, warmup: bool = True) -> None:
        """Load the model (in a thread), optionally run a 2-token warm-up, then clear the cache
        so that the measured run starts cold. Any exception from loading, and a ValueError,
        TypeError or RuntimeError from the warm-up, is raised as ``TargetSetupError`` naming
        the original exception."""
        from prefixcache.engine.async_llm import AsyncLLM

        # the model loads on the engine's own thread (one OpenMP pool, see AsyncLLM); this
        # thread only waits for it
        try:
            self.engine = await asyncio.to_thread(
                AsyncLLM, model=self.model, enable_prefix_caching=self.cache_on, **self.llm_kwargs
            )
        except Exception as error:
            from prefixcache.engine.model_registry import describe_load_error

            raise TargetSetupError(describe_load_error(self.model, error)) from error
        if warmup:
            try:
                await self._generate_quietly(self._warmup_prompt(), 2)
            except (ValueError, TypeError, RuntimeError) as error:
                raise TargetSetupError(
                    f"the warm-up request on model {self.model!r} failed (--no-warmup skips "
                    f"it): {type(error).__name__}: {error}"
                ) from error
            await self.engine.reset_cache()
        self.peak_kv_usage = 0.0

    async def send(self, request: BenchRequest, result: RequestResult) -> None:
        """Stream one request into ``result``; engine errors land in ``result.error``."""
        from prefixcache.engine.async_llm import EngineDeadError, EngineRequestError
        from prefixcache.engine.sampling_params import SamplingParams

        params = SamplingParams(max_tokens=request.max_tokens, temperature=0.0, ignore_eos=True)
        seen = 0
        result.start = time.perf_counter()
        try:
            async for output in self.engine.generate(list(request.prompt_token_ids), params):
                count = len(output.token_ids)
                self._note_usage()
                if count > seen:
                    result.token_times.append(time.perf_counter())
                    seen = count
                if output.finished:
                    result.end = time.perf_counter()
                    result.output_tokens = count
                    result.cached_tokens = output.num_cached_tokens
                    result.engine_ttft = output.metrics.ttft
        except (ValueError, TypeError, EngineRequestError, EngineDeadError) as error:
            result.error = f"{type(error).__name__}: {error}"

    async def close(self) -> None:
        """Record the final counters (after checking the cache's invariants), shut down."""
        if self.engine is not None:
            from prefixcache.engine.async_llm import EngineDeadError

            try:  # a broken invariant is a bug: AssertionError propagates
                self.final_stats = await self.engine.call(_stats_and_invariants)
            except EngineDeadError as error:
                self.final_stats = {"engine_error": str(error)}
            self.engine.shutdown()
            self.engine = None

    def _warmup_prompt(self) -> list[int]:
        """Two blocks of token ids, kept inside the model's vocabulary however small."""
        block_size = self.engine.llm.cache.block_size
        vocab_size = self.engine.llm.config.vocab_size
        return [(WARMUP_FIRST_TOKEN + i) % vocab_size for i in range(2 * block_size)]

    async def _generate_quietly(self, token_ids: list[int], max_tokens: int) -> None:
        from prefixcache.engine.sampling_params import SamplingParams

        params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
        async for _ in self.engine.generate(token_ids, params):
            pass

    def _note_usage(self) -> None:
        """Sample the pool's in-use fraction after every streamed step (a lock-free read the
        engine documents as safe while it runs), keeping the peak."""
        usage = float(self.engine.stats()["usage"])
        self.peak_kv_usage = max(self.peak_kv_usage or 0.0, usage)


def _stats_and_invariants(llm: Any) -> dict[str, Any]:
    """Engine counters after the run; raises AssertionError if the cache is inconsistent."""
    llm.cache.check_invariants()
    return llm.stats()
