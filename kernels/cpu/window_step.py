"""One step's inputs for the sliding-window layers of the fused decoder layers
(``decoder_layers_cpu``): every row of the step over its last ``window`` keys through the
compiled windowed kernel (``windowed_attention.c``), which both libraries' fused layers call
through one function pointer, so a sliding layer's rows are the same bits fused or op by op.

The rows' sequences get one block table (the decode rows' tables, then the prefill
sequences'); a hybrid KV cache passes its slot tables and slot mapping here, the full layers
keep the logical ones of ``PagedStep``.
"""

from __future__ import annotations

import ctypes
import functools
from dataclasses import dataclass

import torch

from prefixcache.kernels.cpu.build import load_f32_library


class _WindowArgs(ctypes.Structure):
    """Mirror of ``window_args`` in layer_args.h (every field 8 bytes)."""

    _fields_ = [
        ("attend", ctypes.c_void_p), ("slots", ctypes.c_void_p), ("tables", ctypes.c_void_p),
        ("tables_stride", ctypes.c_int64), ("seq_of", ctypes.c_void_p),
        ("positions", ctypes.c_void_p), ("out_tables", ctypes.c_void_p),
        ("out_tables_stride", ctypes.c_int64), ("out_seq_of", ctypes.c_void_p),
        ("out_positions", ctypes.c_void_p),
    ]  # fmt: skip


@dataclass(frozen=True)
class WindowStep:
    """The sliding layers' view of one step: where each row's k/v go, and each row's block
    table row and position (the keys it sees are its last ``window`` up to that position);
    the same for the sampled rows."""

    slot_mapping: torch.Tensor  # [num_tokens] int64, -1 skips
    block_tables: torch.Tensor  # [num_sequences, max_blocks] int32
    seq_of: torch.Tensor  # [num_tokens] int32: each row's row of block_tables
    positions: torch.Tensor  # [num_tokens] int64
    sample_block_tables: torch.Tensor  # [num_sampled, max_blocks] int32
    sample_seq_of: torch.Tensor  # [num_sampled] int32
    sample_positions: torch.Tensor  # [num_sampled] int64

    @functools.cached_property
    def args(self) -> _WindowArgs:
        """The ``window_args`` of this step (checked once; the step keeps it alive)."""
        lib = load_f32_library()
        if lib is None:
            raise RuntimeError("the compiled windowed attention is unavailable on this machine")
        wide = (self.slot_mapping, self.positions, self.sample_positions)
        narrow = (self.block_tables, self.seq_of, self.sample_block_tables, self.sample_seq_of)
        if not all(t.is_cpu and t.is_contiguous() for t in (*wide, *narrow)) or any(
            t.dtype is not torch.int64 for t in wide
        ) or any(t.dtype is not torch.int32 for t in narrow):
            raise ValueError("window step tensors must be contiguous CPU int64/int32 tensors")
        if self.seq_of.shape != self.positions.shape or self.slot_mapping.shape != (
            self.positions.shape
        ):
            raise ValueError("slot_mapping, seq_of and positions need one entry per row")
        return _WindowArgs(
            attend=ctypes.cast(lib.wa_windowed_attention, ctypes.c_void_p).value,
            slots=self.slot_mapping.data_ptr(), tables=self.block_tables.data_ptr(),
            tables_stride=self.block_tables.stride(0), seq_of=self.seq_of.data_ptr(),
            positions=self.positions.data_ptr(),
            out_tables=self.sample_block_tables.data_ptr(),
            out_tables_stride=self.sample_block_tables.stride(0),
            out_seq_of=self.sample_seq_of.data_ptr(),
            out_positions=self.sample_positions.data_ptr(),
        )  # fmt: skip


def window_step(
    slot_mapping: torch.Tensor,  # [num_tokens] int64
    positions: torch.Tensor,  # [num_tokens] int64
    decode_block_tables: torch.Tensor,  # [num_decode, max_blocks] int: rows [0, num_decode)
    prefill_block_tables: torch.Tensor,  # [num_prefill, max_blocks] int
    prefill_query_start_loc: torch.Tensor,  # [num_prefill + 1] int, relative to num_decode
    sample_block_tables: torch.Tensor,  # [num_sampled, max_blocks] int
    sample_seq_lens: torch.Tensor,  # [num_sampled] int: keys each sees, itself included
) -> WindowStep:
    """A ``WindowStep`` from a step's paged metadata: decode rows first (one a sequence), then
    each prefill sequence's rows."""
    decode, prefill = decode_block_tables, prefill_block_tables
    width = max(decode.shape[1], prefill.shape[1], 1)
    tables = torch.zeros((decode.shape[0] + prefill.shape[0], width), dtype=torch.int32)
    tables[: decode.shape[0], : decode.shape[1]] = decode
    tables[decode.shape[0]:, : prefill.shape[1]] = prefill
    counts = prefill_query_start_loc.diff().long()
    prefill_seqs = torch.arange(prefill.shape[0], dtype=torch.int32) + decode.shape[0]
    seq_of = torch.cat([torch.arange(decode.shape[0], dtype=torch.int32),
                        torch.repeat_interleave(prefill_seqs, counts)])  # fmt: skip
    return WindowStep(
        slot_mapping=slot_mapping.to(torch.int64).contiguous(), block_tables=tables,
        seq_of=seq_of, positions=positions.to(torch.int64).contiguous(),
        sample_block_tables=sample_block_tables.to(torch.int32).contiguous(),
        sample_seq_of=torch.arange(sample_block_tables.shape[0], dtype=torch.int32),
        sample_positions=sample_seq_lens.to(torch.int64) - 1,
    )  # fmt: skip
