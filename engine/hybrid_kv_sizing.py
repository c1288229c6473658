"""How a hybrid KV cache splits its memory: logical blocks for the full-attention layers, slots
for the sliding-window layers (``engine.sliding_slots``).

A sliding layer only needs each running request's last window, so by default it gets
``max_num_seqs`` windows plus one step's tokens (``default_sliding_slots``), never more rows
than the logical blocks; the rest of a memory budget goes to logical blocks, whose cost is
the full layers' alone. A model whose every layer slides (Mistral) keeps no full-layer
bytes: its whole budget is slots, and its logical blocks are bookkeeping only.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from prefixcache.engine.kv_cache import blocks_for_memory, kv_bytes_per_block, sliding_layer_ids
from prefixcache.engine.model_config import ModelConfig
from prefixcache.engine.sliding_slots import SlidingSlots

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class HybridPool:
    """``num_blocks`` logical blocks (full layers' rows), ``num_slots`` sliding rows of
    ``window`` tokens' reach."""

    num_blocks: int
    num_slots: int
    window: int


def sliding_window_of(config: ModelConfig) -> int | None:
    """The widest sliding window of the model's layers; None when no layer slides."""
    windows = [w for w in config.layer_windows if w is not None]
    return max(windows) if windows else None


def check_hybrid_options(option: object, sliding_slots: int | None, tiered: bool) -> None:
    """TypeError / ValueError for hybrid-cache options no model could honour (checked before
    the model loads): ``option`` not True / False / None, a hybrid cache asked for with KV
    tiers (they store every layer of a block, which a slot pool does not keep), or slots
    sized for a cache that will not be kept."""
    if option is not None and not isinstance(option, bool):
        raise TypeError(f"hybrid_kv_cache must be True, False or None, got {option!r}")
    if option and tiered:
        raise ValueError("hybrid_kv_cache cannot be used with KV tiers (host memory, disk or "
                         "a shared store), which keep every layer of a block")  # fmt: skip
    if sliding_slots is not None and (option is False or tiered):
        raise ValueError(SLOTS_WITHOUT_HYBRID)


SLOTS_WITHOUT_HYBRID = ("kv_sliding_slots sizes a hybrid KV cache, which this engine does not "
                        "keep (a model without sliding layers, KV tiers, or "
                        "hybrid_kv_cache=False)")  # fmt: skip


def use_hybrid(option: object, window: int | None, tiered: bool,
               sliding_slots: int | None) -> bool:  # fmt: skip
    """Whether the engine keeps a hybrid cache: ``option`` True / False, or None for "when
    the model (widest ``window``) has sliding layers and no KV tier is asked for".
    ValueError for a combination that cannot be honoured (``check_hybrid_options`` too)."""
    check_hybrid_options(option, sliding_slots, tiered)
    if option and window is None:
        raise ValueError("hybrid_kv_cache needs a model with sliding-window layers")
    hybrid = option if option is not None else window is not None and not tiered
    if sliding_slots is not None and not hybrid:
        raise ValueError(SLOTS_WITHOUT_HYBRID)
    return hybrid


def default_sliding_slots(window: int, block_size: int, max_num_seqs: int,
                          max_num_batched_tokens: int) -> int:  # fmt: skip
    """Slots for every running request's window (and a block it straddles) plus one step's
    new tokens and the blocks they straddle."""
    per_request = -(-(window - 1) // block_size) + 2
    return max_num_seqs * per_request + -(-max_num_batched_tokens // block_size) + max_num_seqs


def hybrid_pool(
    config: ModelConfig,
    block_size: int,
    dtype: torch.dtype,
    *,
    num_blocks: int | None,
    kv_cache_memory: int,
    sliding_slots: int | None,
    max_num_seqs: int,
    max_num_batched_tokens: int,
    max_model_len: int,
) -> HybridPool:
    """Sizes of a hybrid cache: from ``num_blocks`` (slots: ``sliding_slots`` or the default,
    at most the blocks) or else from ``kv_cache_memory`` bytes. ValueError when the slots
    cannot hold one request's window and step (``SlidingSlots.min_slots``) or the memory
    holds no logical block."""
    window = sliding_window_of(config)
    if window is None:
        raise ValueError("a hybrid KV cache needs a model with sliding-window layers")
    least = SlidingSlots.min_slots(window, block_size, max_num_batched_tokens)
    if sliding_slots is not None and sliding_slots < least:
        raise ValueError(
            f"kv_sliding_slots={sliding_slots} cannot hold one request's window of {window} "
            f"tokens and a step of {max_num_batched_tokens}: at least {least} are needed"
        )
    wanted = sliding_slots or default_sliding_slots(window, block_size, max_num_seqs,
                                                    max_num_batched_tokens)  # fmt: skip
    sliding = len(sliding_layer_ids(config))
    per_block = kv_bytes_per_block(config, block_size, dtype, config.num_layers - sliding)
    per_slot = kv_bytes_per_block(config, block_size, dtype, sliding)
    if num_blocks is not None:
        slots = wanted if sliding_slots is not None else max(least, min(num_blocks, wanted))
        return HybridPool(num_blocks, slots, window)
    if per_block == 0:  # every layer slides: memory is slots, blocks are bookkeeping
        slots = sliding_slots or kv_cache_memory // per_slot
        if slots < least:
            raise ValueError(f"kv_cache_memory={kv_cache_memory} bytes holds {slots} sliding "
                             f"slots; one request needs {least}")  # fmt: skip
        blocks = max(slots, max_num_seqs * -(-max_model_len // block_size))
        return HybridPool(blocks, slots, window)
    blocks = (kv_cache_memory - wanted * per_slot) // per_block
    if sliding_slots is None and blocks < wanted:  # too little memory to gain: a slot a block
        blocks = kv_cache_memory // (per_block + per_slot)
        wanted = max(least, blocks)
        blocks = (kv_cache_memory - wanted * per_slot) // per_block
    if blocks < 1:
        raise ValueError(f"kv_cache_memory={kv_cache_memory} bytes holds no KV block of "
                         f"{block_size} tokens beside {wanted} sliding slots")  # fmt: skip
    return HybridPool(int(blocks), int(wanted), window)


def size_kv_pool(
    config: ModelConfig,
    block_size: int,
    dtype: torch.dtype,
    *,
    num_blocks: int | None,
    kv_cache_memory: int,
    hybrid_kv_cache: bool | None,
    sliding_slots: int | None,
    tiered: bool,
    max_num_seqs: int,
    max_num_batched_tokens: int,
    max_model_len: int,
) -> tuple[int, HybridPool | None]:
    """The engine's logical blocks, and its hybrid pool if it keeps one (``use_hybrid``).
    Left to choose (``hybrid_kv_cache`` and ``sliding_slots`` None), a hybrid pool that cannot
    be sized, or holds no more blocks than the plain one in the same memory, gives way to the
    plain one, saying so in the log; asked for, it raises ValueError instead."""
    if use_hybrid(hybrid_kv_cache, sliding_window_of(config), tiered, sliding_slots):
        chosen = hybrid_kv_cache is not None or sliding_slots is not None
        try:
            pool = hybrid_pool(config, block_size, dtype, num_blocks=num_blocks,
                               kv_cache_memory=kv_cache_memory, sliding_slots=sliding_slots,
                               max_num_seqs=max_num_seqs,
                               max_num_batched_tokens=max_num_batched_tokens,
                               max_model_len=max_model_len)  # fmt: skip
        except ValueError as error:
            if chosen:
                raise
            logger.warning("no hybrid KV cache (%s): every layer keeps every block", error)
        else:
            if num_blocks is not None or chosen:
                return pool.num_blocks, pool
            plain = blocks_for_memory(config, block_size, dtype, kv_cache_memory)
            if pool.num_blocks > plain:
                return pool.num_blocks, pool
            logger.warning("no hybrid KV cache: %d bytes hold no more blocks with it (%d) than "
                           "without (%d)", kv_cache_memory, pool.num_blocks, plain)  # fmt: skip
    if num_blocks is None:
        num_blocks = blocks_for_memory(config, block_size, dtype, kv_cache_memory)
    return num_blocks, None
