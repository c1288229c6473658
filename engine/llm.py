"""LLM: the synchronous, in-process engine — load a model, generate with the prefix cache."""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from prefixcache import PrefixCache
from prefixcache.engine.devices import resolve_device
from prefixcache.engine.disk_kv_tier import DiskKVTier
from prefixcache.engine.engine_core import EngineCore
from prefixcache.engine.engine_options import (
    MIN_MODEL_LEN,
    check_bool_option,
    check_int_option,
    check_kv_pool_size,
    check_optional_int_option,
    parse_memory_size,
    resolve_dtype,
)
from prefixcache.engine.host_kv_tier import HostKVTier
from prefixcache.engine.hybrid_kv_sizing import check_hybrid_options, size_kv_pool
from prefixcache.engine.kv_cache import PagedKVCache, kv_bytes_per_block
from prefixcache.engine.kv_event_publisher import KVEventPublisher, check_kv_events
from prefixcache.engine.kv_tier_codec import tier_codec, tier_storage_dtype
from prefixcache.engine.kv_tiers import KVTiers
from prefixcache.engine.model_registry import DEFAULT_MODEL, load_model
from prefixcache.engine.model_runner import ModelRunner
from prefixcache.engine.outputs import RequestOutput, TokenLogprob
from prefixcache.engine.prompt_inputs import normalize_prompts, single_prompt, to_token_ids
from prefixcache.engine.prompt_logprobs import prompt_token_logprobs
from prefixcache.engine.remote_kv_tier import RemoteKVTier
from prefixcache.engine.sampling_params import MAX_LOGPROBS, SamplingParams
from prefixcache.engine.scheduler import Scheduler
from prefixcache.engine.scheduling_policy import SchedulingPolicy
from prefixcache.engine.sliding_slots import SlidingSlots
from prefixcache.engine.structured_output import GrammarCompiler
from prefixcache.kernels import kv_storage_dtype
from prefixcache.tokens import check_salt
from prefixcache.ttl_pins import TtlPins

DEFAULT_KV_CACHE_MEMORY = 1 << 30
DEFAULT_MAX_MODEL_LEN = 8192
TTL_PIN_SHARE = 4  # each tenant may hold 1 / this of the pool in TTL pins


class LLM:
    """A paged decode engine on the prefix cache.

    ``model``: "smollm2" (default), a Hugging Face folder or a ``.gguf`` path. The pool has
    ``num_blocks`` blocks of ``block_size`` tokens, or as many as fit in ``kv_cache_memory``
    bytes (give at most one; 1 GiB by default). ``max_model_len`` (default 8192, at least 2:
    one prompt token plus one generated) is capped by the model's context length. ``dtype``:
    float32, bfloat16 or float16 (a ``torch.dtype`` or a name, any case). ``None`` means the
    default for every optional setting; any other value is checked before the model loads
    (TypeError / ValueError naming the option). ``enable_prefix_caching=False`` still pages
    KV but never reuses it. ``device``
    ("cpu" by default, "cuda", "cuda:1", ...) holds the weights, the KV pool and every step's
    index tensors; on CUDA attention runs through the Triton kernels, elsewhere through the
    CPU path (see ``prefixcache.kernels``). ``kv_host_memory`` (bytes, or a size such as
    ``"8GiB"``) adds a host-memory tier under the pool: full blocks the pool evicts are copied
    there, and a prompt whose next blocks it holds loads them back instead of computing them
    (``prefixcache.tier_moves``); ``stats()`` counts them (``host_tier_*``). ``kv_disk_dir``
    (with ``kv_disk_size``, 10 GiB by default) adds a persistent disk tier: every full block
    computed is written there in the background, found again after a restart, and read back
    past the pool and the host tier (``disk_tier_*``); ``flush_tiers()`` waits for the writes.
    ``kv_remote`` ("redis://host:port") adds a tier shared with other replicas in Redis or
    Valkey, looked up after the disk (``remote_tier_*``); a dead or slow store reads as misses.
    Blocks in the disk tier or the store are read on a thread of their own while the request
    waits and the others run. ``kv_tier_dtype`` "fp8" or "int8" (under a float pool) stores the
    tiers' blocks quantized: about twice the blocks in the same bytes, at a quantized pool's
    precision (``prefixcache.engine.kv_tier_codec``); "auto" keeps the pool's dtype, exact.
    ``kv_events`` ("tcp://127.0.0.1:5557") publishes every block the pool caches or evicts
    over ZeroMQ in vLLM's KV-event format, for a cache-aware router; ``kv_events_replay``
    adds the socket that resends missed batches (``prefixcache.engine.kv_event_publisher``).
    A model with sliding-window layers (Mistral, Qwen2, Gemma 2/3) keeps a hybrid KV cache
    unless ``hybrid_kv_cache=False`` or a tier is asked for: its sliding layers store only the
    running requests' windows (and what cached windows fit) in ``kv_sliding_slots`` slots
    (default: ``max_num_seqs`` windows and a step), the memory budget's rest going to the
    full layers' blocks (``prefixcache.engine.sliding_slots``, ``hybrid_kv_sizing``).
    """

    def __init__(
        self,
        model: str | Path = DEFAULT_MODEL,
        *,
        block_size: int = 16,
        num_blocks: int | None = None,
        kv_cache_memory: int | None = None,
        max_model_len: int | None = None,
        dtype: torch.dtype | str | None = None,
        enable_prefix_caching: bool = True,
        max_num_seqs: int = 64,
        max_num_batched_tokens: int = 4096,
        scheduling_policy: str = "fcfs",
        num_threads: int | None = None,
        kv_cache_dtype: str = "auto",
        device: str | torch.device | None = None,
        kv_host_memory: int | str | None = None,
        kv_disk_dir: str | Path | None = None,
        kv_disk_size: int | str | None = None,
        kv_remote: str | None = None,
        kv_tier_dtype: str = "auto",
        kv_events: str | None = None,
        kv_events_replay: str | None = None,
        kv_events_topic: str = "",
        hybrid_kv_cache: bool | None = None,
        kv_sliding_slots: int | None = None,
    ) -> None:
        check_int_option("block_size", block_size)
        check_kv_events(kv_events, kv_events_replay)
        host_memory = parse_memory_size("kv_host_memory", kv_host_memory)
        disk_size = parse_memory_size("kv_disk_size", kv_disk_size)
        if disk_size is not None and kv_disk_dir is None:
            raise ValueError("kv_disk_size needs kv_disk_dir")
        check_kv_pool_size(num_blocks, kv_cache_memory)
        check_optional_int_option("kv_sliding_slots", kv_sliding_slots)
        tiered = host_memory is not None or kv_disk_dir is not None or kv_remote is not None
        check_hybrid_options(hybrid_kv_cache, kv_sliding_slots, tiered)
        check_optional_int_option("max_model_len", max_model_len, MIN_MODEL_LEN)
        check_optional_int_option("num_threads", num_threads)
        check_bool_option("enable_prefix_caching", enable_prefix_caching)
        check_int_option("max_num_seqs", max_num_seqs)
        check_int_option("max_num_batched_tokens", max_num_batched_tokens)
        compute_dtype = resolve_dtype(dtype)
        # a bad tier dtype fails before the model loads (the pool's float dtype is not known
        # yet; whether it is quantized is)
        tier_storage_dtype(kv_tier_dtype, kv_storage_dtype(kv_cache_dtype, torch.float32))
        if num_threads is not None:
            torch.set_num_threads(num_threads)
        self.device = resolve_device(device)
        # bound before the model loads: a busy port fails in a second, not after minutes
        self.kv_events: KVEventPublisher | None = None
        if kv_events is not None:
            self.kv_events = KVEventPublisher(kv_events, kv_events_replay, kv_events_topic)
        try:
            loaded = load_model(model, dtype=compute_dtype, device=self.device)
        except BaseException:
            self.close()
            raise
        self.model_name = str(model)
        self.config = loaded.config
        self.tokenizer = loaded.tokenizer
        self.chat_template = loaded.chat_template
        self.dtype = loaded.model.dtype
        if max_model_len is None:
            max_model_len = DEFAULT_MAX_MODEL_LEN
        self.max_model_len = min(max_model_len, self.config.max_position_embeddings)
        # Accelerators never grow the RoPE table inside a step (that would sync with the host).
        loaded.model.rotary.reserve(self.max_model_len)
        if loaded.model.local_rotary is not None:
            loaded.model.local_rotary.reserve(self.max_model_len)
        pool_dtype = kv_storage_dtype(kv_cache_dtype, self.dtype)
        memory = DEFAULT_KV_CACHE_MEMORY if kv_cache_memory is None else kv_cache_memory
        num_blocks, hybrid = size_kv_pool(
            self.config, block_size, pool_dtype, num_blocks=num_blocks, kv_cache_memory=memory,
            hybrid_kv_cache=hybrid_kv_cache, sliding_slots=kv_sliding_slots, tiered=tiered,
            max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens,
            max_model_len=self.max_model_len,
        )  # fmt: skip
        tier_dtype = tier_storage_dtype(kv_tier_dtype, pool_dtype)
        host_slots = 0
        if host_memory is not None:
            host_slots = host_memory // kv_bytes_per_block(self.config, block_size, tier_dtype)
            if host_slots < 1:
                raise ValueError(f"kv_host_memory={kv_host_memory!r} holds no KV block")
        self.cache = PrefixCache(num_blocks, block_size, model_fingerprint=loaded.fingerprint,
                                 host_tier_blocks=host_slots)  # fmt: skip
        self.sliding: SlidingSlots | None = None
        if hybrid is not None:  # the slots know which blocks the tree still holds
            self.sliding = SlidingSlots(num_blocks, hybrid.num_slots, block_size, hybrid.window,
                                        self.cache.tree.node_of)  # fmt: skip
        if self.kv_events is not None:
            self.cache.set_event_listener(self.kv_events)
        in_pool_rows = self.device.type != "cuda" and tier_dtype == pool_dtype
        self.kv = PagedKVCache(
            self.config, num_blocks, block_size, self.dtype, self.device, kv_cache_dtype,
            extra_rows=host_slots if in_pool_rows else 0,
            sliding_slots=None if self.sliding is None else self.sliding.num_slots,
        )
        tiered = host_slots or kv_disk_dir is not None or kv_remote is not None
        codec = tier_codec(kv_tier_dtype, loaded.model, self.kv) if tiered else None
        self.tiers = KVTiers(self.config, self.kv, self.cache, loaded.fingerprint, host_slots,
                             kv_disk_dir, disk_size, kv_remote, codec)  # fmt: skip
        scheduler = Scheduler(
            self.cache,
            max_num_seqs,
            max_num_batched_tokens,
            enable_prefix_caching,
            SchedulingPolicy(scheduling_policy),
            self.tiers.fetcher,
            self.sliding,
        )
        runner = ModelRunner(loaded.model, self.kv, self.config.head_dim, self.tiers.host,
                             self.tiers.lower, self.tiers.block_bytes, self.sliding)  # fmt: skip
        eos = tuple(self.tokenizer.eos_token_ids or self.config.eos_token_ids)
        # a quarter of the pool per tenant at most in TTL pins (cache_control)
        self.ttl_pins = TtlPins(self.cache, max(1, num_blocks // TTL_PIN_SHARE))
        self.grammars = GrammarCompiler(self.tokenizer.backend.to_str, self.config.vocab_size,
                                        eos)  # fmt: skip
        self.engine = EngineCore(
            scheduler, runner, self.tokenizer.decode, eos, self.max_model_len,
            prefix_stable_decode=self.tokenizer.decode_concatenates, grammars=self.grammars,
            vocab_size=self.config.vocab_size, ttl_pins=self.ttl_pins,
        )
        self._ids = itertools.count()

    # ------------------------------------------------------------------ generation
    def generate(
        self,
        prompts: Any,
        params: SamplingParams | None = None,
        salt: str | None = None,
    ) -> list[RequestOutput]:
        """Generate for one prompt or a list (strings or token id lists); results in order."""
        params = params or SamplingParams()
        encoded = self._encode_all(prompts)
        for token_ids in encoded:  # validate everything before queueing anything
            self.check_request(token_ids, params, salt)
        request_ids = [self._add(token_ids, params, salt) for token_ids in encoded]
        finished: dict[str, RequestOutput] = {}
        while self.engine.has_unfinished():
            for output in self.engine.step(finished_only=True):
                finished[output.request_id] = output
        return [finished[request_id] for request_id in request_ids]

    def chat(
        self,
        messages: Sequence[Mapping[str, Any]] | Sequence[Sequence[Mapping[str, Any]]],
        params: SamplingParams | None = None,
        salt: str | None = None,
    ) -> list[RequestOutput]:
        """Generate replies to one conversation (OpenAI-style message dicts) or a list of them."""
        conversations = [messages] if messages and isinstance(messages[0], Mapping) else messages
        return self.generate([self.render_chat(c) for c in conversations], params, salt)

    def render_chat(self, messages: Sequence[Mapping[str, Any]],
                    tools: Sequence[Mapping[str, Any]] | None = None) -> str:
        """The prompt text the model's chat template makes of ``messages`` (and OpenAI
        ``tools``; see ``ChatTemplate.render``)."""
        if self.chat_template is None:
            raise ValueError(f"model {self.model_name!r} has no chat template")
        return self.chat_template.render(messages, add_generation_prompt=True, tools=tools)

    def warm(self, prompt: str | Sequence[int], salt: str | None = None, pin: bool = False) -> int:
        """Prefill ``prompt`` without sampling, leaving it cached (its full blocks and the
        partly filled last one); returns how many prompt tokens are cached afterwards. ``pin``
        keeps them from eviction until unpinned."""
        token_ids = self._encode_one(prompt)
        self.generate([token_ids.tolist()], SamplingParams(max_tokens=1, temperature=0.0), salt)
        if pin:
            self.cache.pin(token_ids, salt)
        return self.cache.lookup(token_ids, salt, partial_block=True)

    def encode(self, prompt: str | Sequence[int]) -> list[int]:
        """Token ids of one prompt, validated against the vocabulary and max_model_len."""
        return self._encode_one(prompt).tolist()

    @property
    def host_tier(self) -> HostKVTier | None:
        return self.tiers.host

    @property
    def disk_tier(self) -> DiskKVTier | None:
        return self.tiers.disk

    @property
    def remote_tier(self) -> RemoteKVTier | None:
        return self.tiers.remote

    def flush_tiers(self) -> None:
        """Wait until every block handed to the disk tier is written (a no-op without one)."""
        if self.tiers.lower is not None:
            self.engine._persist_committed()
            self.tiers.flush()

    def close(self) -> None:
        """Send the KV events still queued and stop the publisher (idempotent); the engine
        keeps working without it."""
        if self.kv_events is not None:
            if hasattr(self, "cache"):
                self.cache.set_event_listener(None)
                self.cache.enable_events = False
            self.kv_events.close()

    def clear_disk_tier(self) -> int:
        """Delete every record of the disk tier (after its queued writes); returns how many."""
        if self.disk_tier is None:
            return 0
        self.flush_tiers()
        return self.disk_tier.store.clear()

    def stats(self) -> dict[str, Any]:
        """Prefix-cache counters plus engine counters."""
        stats = self.cache.stats()
        scheduler = self.engine.scheduler
        stats.update(
            preemptions=scheduler.num_preemptions,
            running=len(scheduler.running),
            waiting=len(scheduler.waiting),
            finished_requests=self.engine.num_finished,
            request_errors=self.engine.num_request_errors,
            failed_steps=self.engine.num_failed_steps,
        )
        stats.update(self.tiers.stats())
        if self.sliding is not None:
            stats.update(self.sliding.stats())
        self.ttl_pins.expire()
        stats.update(self.ttl_pins.stats())
        return stats

    # ------------------------------------------------------------------ internals
    def _encode_all(self, prompts: Any) -> list[np.ndarray]:  # each [num_tokens] int32
        return [self._token_ids(p) for p in normalize_prompts(prompts)]

    def _encode_one(self, prompt: Any) -> np.ndarray:  # [num_tokens] int32
        return self._token_ids(single_prompt(prompt))

    def prompt_logprobs(self, prompt: str | Sequence[int],
                        top: int = 0) -> list[TokenLogprob | None]:  # fmt: skip
        """Each prompt token's log probability given the ones before it (None for the first),
        its rank and the ``top`` (0..20) likeliest tokens there, recomputed from the prompt
        (``prefixcache.engine.prompt_logprobs``); the cache is neither read nor changed."""
        if isinstance(top, bool) or not isinstance(top, int) or not 0 <= top <= MAX_LOGPROBS:
            raise ValueError(f"top must be an int in [0, {MAX_LOGPROBS}], got {top!r}")
        token_ids = self._token_ids(prompt)
        return prompt_token_logprobs(self.engine.runner.model, self.config, token_ids.tolist(),
                                     top)  # fmt: skip

    def _token_ids(self, prompt: str | Sequence[int]) -> np.ndarray:  # [num_tokens] int32
        return to_token_ids(prompt, self.tokenizer.encode, self.config.vocab_size,
                            self.max_model_len)

    def check_request(
        self, token_ids: Sequence[int] | np.ndarray, params: SamplingParams, salt: str | None
    ) -> None:
        """TypeError/ValueError for a bad salt, bad params, or a request that could never fit in
        the KV pool, even alone."""
        check_salt(salt)
        if not isinstance(params, SamplingParams):
            raise TypeError(f"params must be SamplingParams, got {type(params).__name__}")
        if params.structured is not None:
            self.grammars.check(params.structured)  # StructuredOutputError (a ValueError)
        vocab = self.config.vocab_size
        outside = [token for token in params.logit_bias if token >= vocab]
        if outside:
            raise ValueError(f"logit_bias token id {outside[0]} is outside the vocabulary "
                             f"[0, {vocab})")
        needed = -(
            -min(len(token_ids) + params.max_tokens, self.max_model_len) // self.cache.block_size
        )
        if needed > self.cache.num_blocks:
            raise ValueError(
                f"the request needs {needed} KV blocks; the pool has {self.cache.num_blocks}"
            )
        pinned = self.cache.num_pinned_blocks if self.cache.num_pinned_nodes else 0
        if needed > self.cache.num_blocks - pinned:
            # pinned blocks on its own cached prefix are the request's to share
            own = self.cache.lookup(token_ids, salt) // self.cache.block_size
            if needed > self.cache.num_blocks - pinned + own:
                raise ValueError(
                    f"the request needs {needed} KV blocks; pins hold {pinned} of the pool's "
                    f"{self.cache.num_blocks}, and {own} blocks of its prefix are cached"
                )

    def _add(self, token_ids: np.ndarray, params: SamplingParams, salt: str | None) -> str:
        request_id = f"req-{next(self._ids)}"
        self.engine.add_request(request_id, token_ids, params, salt)
        return request_id
