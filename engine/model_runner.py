"""Runs one scheduled step on the model: copy-on-write copies, KV writes, paged attention, logits.

The runner owns the KV tensors and never touches the radix tree: it reads block ids from the
scheduled requests and the copy ops from the scheduler.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import torch

from prefixcache import CopyOp
from prefixcache.engine.attention_metadata import (
    AttentionMetadata,
    build_attention_metadata,
    sliding_metadata,
)
from prefixcache.engine.kv_cache import PagedKVCache, calibrate_kv_scales
from prefixcache.engine.scheduler_output import SchedulerOutput
from prefixcache.kernels import (
    block_copier,
    get_kernel_backend,
    paged_decode_attention,
    paged_prefill_attention,
    store_kv,
)
from prefixcache.kernels.cpu.decoder_layer import FUSED_DTYPES, PagedStep
from prefixcache.kernels.cpu.window_step import WindowStep, window_step
from prefixcache.kernels.cpu.windowed_attention import (
    windowed_attention_cpu,
    windowed_attention_supports,
)
from prefixcache.kernels.quantization import read_stored

if TYPE_CHECKING:
    from prefixcache.engine.host_kv_tier import HostKVTier
    from prefixcache.engine.kv_block_bytes import BlockBytes
    from prefixcache.engine.lower_tiers import LowerTiers
    from prefixcache.engine.sliding_slots import SlidingSlots
    from prefixcache.host_tier import PersistBlock, TierCopy


def copy_waves(ops: list[CopyOp]) -> list[list[CopyOp]]:
    """``ops`` as batches to run one after another, in order, with no batch writing a block it
    also reads (``copy_blocks`` runs a batch's pairs at once). A block one op reads can be
    freed and handed out as another op's destination in the same step: the read comes
    first."""
    waves: list[list[CopyOp]] = []
    reads: set[int] = set()
    writes: set[int] = set()
    for op in ops:
        if not waves or op.dst in reads or op.src in writes:
            waves.append([])
            reads, writes = set(), set()
        waves[-1].append(op)
        reads.add(op.src)
        writes.add(op.dst)
    return waves


class PagedAttention:
    """The model's ``AttentionFn`` for one step: store the new k/v, attend over the pool.

    ``paged_step`` also hands the model the step's inputs and a layer's pools for the fused CPU
    decoder layers (``prefixcache.kernels.cpu.decoder_layers_cpu``), which do the same with the
    layers' other ops in one compiled call.
    """

    def __init__(self, kv: PagedKVCache, meta: AttentionMetadata, scale: float,
                 prefill_implementation: str | None = None,
                 layer_windows: Sequence[int | None] = (),
                 softcap: float | None = None,
                 sliding_meta: AttentionMetadata | None = None) -> None:  # fmt: skip
        """``prefill_implementation`` names the prefill attention to run (``"sdpa"``: SDPA in
        the model's dtype, chosen by measurement for the step's row count); None: dispatch's
        default. ``layer_windows[l]``: layer l's sliding window (None or absent: full);
        ``softcap``: the attention scores' soft-cap (Gemma 2), None for none.
        ``sliding_meta``: the metadata in slots that the slot pools of a hybrid cache's
        sliding layers (``kv.sliding_layers``) are read and written with."""
        self.kv = kv
        self.meta = meta
        self.sliding_meta = sliding_meta
        self.sliding_layers = frozenset(kv.sliding_layers)
        self.scale = scale
        self.prefill_implementation = prefill_implementation
        self.layer_windows = tuple(layer_windows)
        self.softcap = softcap
        self._step: PagedStep | None = None
        self._window_rows: WindowStep | None = None  # see _window_step

    def paged_step(self, layer_idx: int) -> tuple[PagedStep, torch.Tensor, torch.Tensor] | None:
        """The step's inputs for the fused CPU decoder layer with layer ``layer_idx``'s K and V
        pools, or None where that layer cannot run fused (a quantized or non-CPU pool, one
        neither bf16 nor float32, soft-capped scores, the kernel backend not "auto"). A
        sliding layer's pools are its slot pools in a hybrid cache; the step then carries the
        sliding layers' inputs too (``PagedStep.window``)."""
        k_cache = self.kv.k[layer_idx]
        if (
            self.softcap is not None  # the fused layer's scores are uncapped
            or self.kv.k_scale[layer_idx] is not None
            or k_cache.dtype not in FUSED_DTYPES
            or not k_cache.is_cpu
            or get_kernel_backend() != "auto"
        ):
            return None
        if self._step is None:  # once per step, shared by every layer
            meta = self.meta
            rows = lambda t: t.to(torch.int32).contiguous()  # noqa: E731
            self._step = PagedStep(
                slot_mapping=meta.slot_mapping.to(torch.int64).contiguous(),
                num_decode=meta.num_decode_tokens,
                decode_block_tables=rows(meta.decode_block_tables),
                decode_seq_lens=rows(meta.decode_seq_lens),
                prefill_block_tables=rows(meta.prefill_block_tables),
                prefill_query_start_loc=rows(meta.prefill_query_start_loc),
                prefill_context_lens=rows(meta.prefill_context_lens),
                scale=self.scale,
                sample_rows=meta.sample_rows,
                sample_block_tables=rows(meta.sample_block_tables),
                sample_seq_lens=rows(meta.sample_seq_lens),
                window=self._window_step(),
            )
        return self._step, k_cache, self.kv.v[layer_idx]

    def _window_step(self) -> WindowStep | None:
        """The sliding layers' rows and tables (in slots for a hybrid cache), once a step for
        every sliding layer, fused or not; None when no layer slides."""
        if self._window_rows is None and any(w is not None for w in self.layer_windows):
            meta = self.sliding_meta if self.sliding_meta is not None else self.meta
            self._window_rows = window_step(
                meta.slot_mapping, meta.positions, meta.decode_block_tables,
                meta.prefill_block_tables, meta.prefill_query_start_loc,
                meta.sample_block_tables, meta.sample_seq_lens,
            )  # fmt: skip
        return self._window_rows

    def __call__(
        self,
        layer_idx: int,
        q: torch.Tensor,  # [num_tokens, num_heads, head_dim]
        k: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
        v: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
        *,
        query_rows: torch.Tensor | None = None,  # [num_sampled]: must be meta.sample_rows
    ) -> torch.Tensor:  # [num_tokens or num_sampled, num_heads, head_dim]
        meta = self.meta
        if self.sliding_meta is not None and layer_idx in self.sliding_layers:
            meta = self.sliding_meta
        window = self._window(layer_idx)
        k_cache, v_cache = self.kv.k[layer_idx], self.kv.v[layer_idx]
        k_scale, v_scale = self.kv.k_scale[layer_idx], self.kv.v_scale[layer_idx]
        store_kv(k, v, k_cache, v_cache, meta.slot_mapping, k_scale, v_scale)
        if (window is not None and self.softcap is None and k_scale is None
                and get_kernel_backend() == "auto" and windowed_attention_supports(q, k_cache)):
            # every row over its own window, read from the pool it was just stored in
            return self._windowed(q, k_cache, v_cache, window, query_rows is not None)
        if k_scale is not None:
            # a quantized pool: the new tokens attend to their own keys and values as stored,
            # as every later step (and a request that finds them cached) will, so whether a
            # key is new or cached, in this chunk or an earlier one, changes nothing
            k = read_stored(k_cache, meta.slot_mapping, k_scale, k.dtype)
            v = read_stored(v_cache, meta.slot_mapping, v_scale, v.dtype)
        if query_rows is not None:
            # Only the sampled rows: each is its sequence's last new token, and every key it
            # sees is in the pool now, so this is decode attention over the updated blocks.
            if query_rows is not self.meta.sample_rows:
                raise ValueError("paged attention answers query_rows=sample_rows only")
            if query_rows.numel() == 0:
                return q.new_empty(q.shape)
            return paged_decode_attention(
                q, k_cache, v_cache, meta.sample_block_tables, meta.sample_seq_lens, self.scale,
                k_scale, v_scale, window, self.softcap,
            )
        split = meta.num_decode_tokens
        if split == q.shape[0]:
            return paged_decode_attention(
                q, k_cache, v_cache, meta.decode_block_tables, meta.decode_seq_lens, self.scale,
                k_scale, v_scale, window, self.softcap,
            )
        prefill = paged_prefill_attention(
            q[split:],
            k[split:],
            v[split:],
            k_cache,
            v_cache,
            meta.prefill_block_tables,
            meta.prefill_query_start_loc,
            meta.prefill_context_lens,
            self.scale,
            k_scale,
            v_scale,
            implementation=self.prefill_implementation,
            sliding_window=window,
            softcap=self.softcap,
        )
        if split == 0:
            return prefill
        decode = paged_decode_attention(
            q[:split], k_cache, v_cache, meta.decode_block_tables, meta.decode_seq_lens, self.scale,
            k_scale, v_scale, window, self.softcap,
        )
        return torch.cat([decode, prefill])

    def _windowed(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                  window: int, sampled: bool) -> torch.Tensor:
        """The compiled sliding-window attention of the step's rows (``sampled``: of the
        sampled rows only, ``q`` holding theirs), each over its sequence's row of the step's
        window tables (``WindowStep``, the same the fused layers read)."""
        rows = self._window_step()
        assert rows is not None  # a layer has this window
        if sampled:
            return windowed_attention_cpu(q, k_cache, v_cache, rows.sample_block_tables,
                                          rows.sample_seq_of, rows.sample_positions, window,
                                          self.scale)  # fmt: skip
        return windowed_attention_cpu(q, k_cache, v_cache, rows.block_tables, rows.seq_of,
                                      rows.positions, window, self.scale)

    def _window(self, layer_idx: int) -> int | None:
        windows = self.layer_windows
        return windows[layer_idx] if layer_idx < len(windows) else None


class ModelRunner:
    """Executes ``SchedulerOutput``s; returns logits of the sequences that sample this step."""

    def __init__(self, model: torch.nn.Module, kv: PagedKVCache, head_dim: int,
                 host_tier: HostKVTier | None = None, lower_tiers: LowerTiers | None = None,
                 block_bytes: BlockBytes | None = None,
                 sliding: SlidingSlots | None = None) -> None:  # fmt: skip
        """A quantized (fp8/int8) pool gets its static scales here, before any request.
        ``host_tier`` / ``lower_tiers`` hold the bytes of the prefix cache's tiers, if any;
        ``block_bytes`` writes the lower tiers' payloads into the pool. ``sliding``: the
        slot map of a hybrid cache (``kv.sliding_slots``), which the scheduler keeps."""
        if (sliding is None) != (kv.sliding_slots is None):
            raise ValueError("a hybrid KV cache and its slot map come together")
        self.sliding = sliding
        self.model = model
        self.host_tier = host_tier
        self.lower_tiers = lower_tiers
        self.block_bytes = block_bytes
        self.device = model.device
        self.kv = kv
        config = getattr(model, "config", None)
        self.scale = config.softmax_scale if config is not None else head_dim**-0.5
        self.layer_windows = config.layer_windows if config is not None else ()
        self.softcap = config.attn_logit_softcap if config is not None else None
        # copy-on-write copies: the full layers' pools by logical block, a hybrid cache's
        # sliding layers' by slot
        full = kv.full_layers
        self.copy_blocks = (block_copier([kv.k[i] for i in full], [kv.v[i] for i in full])
                            if full else None)  # fmt: skip
        sliding_layers = kv.sliding_layers
        self.copy_slots = (block_copier([kv.k[i] for i in sliding_layers],
                                        [kv.v[i] for i in sliding_layers])
                           if sliding_layers else None)  # fmt: skip
        calibrate_kv_scales(model, kv)

    def apply_tier_copies(self, writebacks: Sequence[TierCopy], loads: Sequence[TierCopy],
                          disk_loads: Sequence[tuple[int, bytes]] = ()) -> None:  # fmt: skip
        """The prefix cache's tier copies before the next step: host write-backs, host loads,
        then the payloads read from disk into their pool blocks."""
        if writebacks or loads:
            if self.host_tier is None:
                raise RuntimeError("host tier copies without a host tier")
            self.host_tier.apply(writebacks, loads)
        if disk_loads:
            if self.block_bytes is None:
                raise RuntimeError("lower-tier loads without a lower tier")
            self.block_bytes.load([b for b, _ in disk_loads], [p for _, p in disk_loads])

    def persist(self, blocks: Sequence[PersistBlock]) -> None:
        """Hand newly cached blocks (their bytes read now) to the lower tiers' writers."""
        if self.lower_tiers is not None and blocks:
            self.lower_tiers.persist(blocks)

    @torch.inference_mode()
    def execute(self, out: SchedulerOutput) -> torch.Tensor:  # [num_sampled, vocab] float32
        """Logits (on the CPU, for the sampler) of the rows that sample this step."""
        return self.model.compute_logits(self._sampled_hidden(out)).cpu()

    @torch.inference_mode()
    def execute_greedy(self, out: SchedulerOutput) -> list[int]:  # [num_sampled] token ids
        """The step of ``execute`` for a batch whose every sampled row is greedy: each row's
        argmax token (the lowest id among equal maxima), without handing logits out, so the
        model may skip most of the output head (``CausalLM.greedy_tokens``)."""
        return self.model.greedy_tokens(self._sampled_hidden(out)).tolist()

    def _copy(self, ops: list[CopyOp]) -> None:
        """The step's block copies, in waves (``copy_waves``), in every layer's pools; a
        hybrid cache's sliding layers copy the blocks' slots."""
        for wave in copy_waves(ops):
            if self.copy_blocks is not None:
                self._run_copies(self.copy_blocks, wave)
            if self.copy_slots is not None:
                assert self.sliding is not None
                self._run_copies(self.copy_slots, self.sliding.slot_copies(wave))

    def _run_copies(self, copier: Callable[..., None], wave: list[CopyOp]) -> None:
        if wave:
            pairs = torch.tensor([op[:2] for op in wave], dtype=torch.int64, device=self.device)
            copier(pairs, [op.num_tokens for op in wave])  # pairs: [n, 2]

    def _sampled_hidden(self, out: SchedulerOutput) -> torch.Tensor:  # [num_sampled, hidden]
        self._copy(out.copy_ops)
        host_meta = build_attention_metadata(out, self.kv.block_size)
        meta = host_meta.to(self.device)
        sliding_meta = None
        if self.sliding is not None:
            sliding_meta = sliding_metadata(host_meta, self.sliding).to(self.device)
        choice = getattr(self.model, "kernel_choice", None)
        implementation = (
            None if choice is None else choice.implementation("attention", meta.input_ids.shape[0])
        )
        attention = PagedAttention(self.kv, meta, self.scale, implementation, self.layer_windows,
                                   self.softcap, sliding_meta)  # fmt: skip
        # Only the sampled rows leave the last layer.
        return self.model(meta.input_ids, meta.positions, attention, meta.sample_rows)
