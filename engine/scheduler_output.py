"""What the scheduler hands the runner for one step (no tensors: plain ids and counts)."""

from __future__ import annotations

from dataclasses import dataclass, field

from prefixcache import CopyOp
from prefixcache.engine.request import Request


@dataclass
class ScheduledSequence:
    """``num_new_tokens`` tokens of ``request`` starting at position ``context_len`` run this step.

    ``samples`` is true when the step reaches the request's last token, so its logits are sampled.
    """

    request: Request
    context_len: int
    num_new_tokens: int
    samples: bool


@dataclass
class SchedulerOutput:
    """One step: decode sequences (one new token each over a context) come first, then prefill
    chunks; ``copy_ops`` must run before any KV of this step is written."""

    decodes: list[ScheduledSequence] = field(default_factory=list)
    prefills: list[ScheduledSequence] = field(default_factory=list)
    copy_ops: list[CopyOp] = field(default_factory=list)
    preempted: list[Request] = field(default_factory=list)

    @property
    def sequences(self) -> list[ScheduledSequence]:
        return self.decodes + self.prefills

    @property
    def num_tokens(self) -> int:
        return sum(seq.num_new_tokens for seq in self.decodes + self.prefills)

    @property
    def is_empty(self) -> bool:
        return not self.decodes and not self.prefills
