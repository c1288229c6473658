"""Index tensors that tell paged attention where each sequence's tokens and blocks are."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import numpy as np
import torch

from prefixcache.engine.scheduler_output import ScheduledSequence, SchedulerOutput

if TYPE_CHECKING:
    from prefixcache.engine.sliding_slots import SlidingSlots


@dataclass
class AttentionMetadata:
    """The flat batch is decode tokens first (one per sequence), then prefill chunks."""

    input_ids: torch.Tensor  # [num_tokens] int64
    positions: torch.Tensor  # [num_tokens] int64
    slot_mapping: torch.Tensor  # [num_tokens] int64: block * block_size + offset
    num_decode_tokens: int
    decode_block_tables: torch.Tensor  # [num_decodes, max_blocks] int32
    decode_seq_lens: torch.Tensor  # [num_decodes] int32, including the new token
    prefill_block_tables: torch.Tensor  # [num_prefills, max_blocks] int32
    prefill_query_start_loc: torch.Tensor  # [num_prefills + 1] int32
    prefill_context_lens: torch.Tensor  # [num_prefills] int32
    sample_rows: torch.Tensor  # [num_sampled] int64: rows of the batch whose logits are sampled
    sample_block_tables: torch.Tensor  # [num_sampled, max_blocks] int32, per sampled row
    sample_seq_lens: torch.Tensor  # [num_sampled] int32: tokens its row sees, itself included

    def to(self, device: torch.device) -> AttentionMetadata:
        """The same metadata with every tensor on ``device`` (itself when already there)."""
        if device.type == "cpu":
            return self
        moved = {
            name: value.to(device, non_blocking=True) if isinstance(value, torch.Tensor) else value
            for name, value in vars(self).items()
        }
        return AttentionMetadata(**moved)


def build_attention_metadata(out: SchedulerOutput, block_size: int) -> AttentionMetadata:
    """Lay out one step's tokens, positions and slots from the scheduled sequences."""
    ids, positions, slots, sample_rows = [], [], [], []
    row = 0
    for seq in out.decodes + out.prefills:
        span = np.arange(seq.context_len, seq.context_len + seq.num_new_tokens)  # [new]
        blocks = np.asarray(seq.request.block_ids, dtype=np.int64)
        ids.append(seq.request.tokens[span])
        positions.append(span)
        slots.append(blocks[span // block_size] * block_size + span % block_size)
        row += seq.num_new_tokens
        if seq.samples:
            sample_rows.append(row - 1)
    starts = np.cumsum([0] + [seq.num_new_tokens for seq in out.prefills])
    decode_tables = _block_tables(out.decodes)
    decode_lens = torch.tensor([s.context_len + 1 for s in out.decodes], dtype=torch.int32)
    sampled = [seq for seq in out.decodes + out.prefills if seq.samples]
    if sampled == out.decodes:  # every sequence decodes and samples: the same tables
        sample_tables, sample_lens = decode_tables, decode_lens
    else:
        sample_tables = _block_tables(sampled)
        sample_lens = torch.tensor(
            [s.context_len + s.num_new_tokens for s in sampled], dtype=torch.int32
        )
    return AttentionMetadata(
        input_ids=torch.from_numpy(np.concatenate(ids).astype(np.int64)),
        positions=torch.from_numpy(np.concatenate(positions)),
        slot_mapping=torch.from_numpy(np.concatenate(slots)),
        num_decode_tokens=len(out.decodes),
        decode_block_tables=decode_tables,
        decode_seq_lens=decode_lens,
        prefill_block_tables=_block_tables(out.prefills),
        prefill_query_start_loc=torch.from_numpy(starts.astype(np.int32)),
        prefill_context_lens=torch.tensor([s.context_len for s in out.prefills], dtype=torch.int32),
        sample_rows=torch.tensor(sample_rows, dtype=torch.int64),
        sample_block_tables=sample_tables,
        sample_seq_lens=sample_lens,
    )


def sliding_metadata(meta: AttentionMetadata, slots: SlidingSlots) -> AttentionMetadata:
    """``meta`` (on the CPU) for the sliding-window layers of a hybrid cache: slot mapping and
    block tables in slots instead of logical blocks (a block without a slot reads slot 0: it
    is outside every window that reads it, so its keys are masked)."""
    bs = slots.block_size
    logical = meta.slot_mapping.numpy()
    targets = slots.slot_of[logical // bs]
    if (targets < 0).any():
        raise RuntimeError("a token is written to a block without a sliding slot")

    def table(blocks: torch.Tensor) -> torch.Tensor:  # [seqs, max_blocks] int32
        return torch.from_numpy(slots.slot_table(blocks.numpy()).astype(np.int32))

    return replace(
        meta,
        slot_mapping=torch.from_numpy(targets * bs + logical % bs),
        decode_block_tables=table(meta.decode_block_tables),
        prefill_block_tables=table(meta.prefill_block_tables),
        sample_block_tables=table(meta.sample_block_tables),
    )


def _block_tables(seqs: list[ScheduledSequence]) -> torch.Tensor:  # [num_seqs, max_blocks] int32
    width = max((len(seq.request.block_ids) for seq in seqs), default=0)
    table = np.zeros((len(seqs), width), dtype=np.int32)
    for index, seq in enumerate(seqs):
        table[index, : len(seq.request.block_ids)] = seq.request.block_ids
    return torch.from_numpy(table)
