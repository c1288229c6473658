"""The shapes of a model's ops that ``kernel_choice`` times and chooses for, and the row-count
buckets a call falls in."""

from __future__ import annotations

from dataclasses import dataclass

ROW_BUCKETS = (1, 4, 16, 64, 256, 1024)  # rows timed per bucket; a call uses the largest <=
PREFILL_BUCKETS = (64, 256, 1024)  # the prefill attention's (decode stays compiled)
COMPILED = "compiled"  # the implementation names
ONEDNN = "onednn"
SDPA = "sdpa"


def bucket_of(rows: int) -> int:
    """The bucket a call of ``rows`` rows uses: the largest of ``ROW_BUCKETS`` not above it."""
    chosen = ROW_BUCKETS[0]
    for bucket in ROW_BUCKETS:
        if bucket <= rows:
            chosen = bucket
    return chosen


@dataclass(frozen=True)
class ProjectionShape:
    """One kind of projection of a model: its name (``qkv``, ``o``, ``gate_up``, ``down``,
    ``head``), weight shape ``[out_features, in_features]``, and the buckets it meets (the
    output head only sees the sampled rows)."""

    name: str
    out_features: int
    in_features: int
    buckets: tuple[int, ...] = ROW_BUCKETS
    library: str = ONEDNN

    def key(self) -> list[object]:
        return [self.name, self.out_features, self.in_features, list(self.buckets)]

    @property
    def dims(self) -> tuple[int, ...]:
        return (self.out_features, self.in_features)

    def flops(self, rows: int) -> int:
        return 2 * rows * self.out_features * self.in_features


@dataclass(frozen=True)
class AttentionShape:
    """A model's prefill attention: query heads, kv heads and head_dim; timed as a prompt of
    each bucket's length with nothing cached (the step's rows are its new tokens)."""

    heads: int
    kv_heads: int
    head_dim: int
    buckets: tuple[int, ...] = PREFILL_BUCKETS
    name: str = "attention"
    library: str = SDPA

    def key(self) -> list[object]:
        return [self.name, self.heads, self.kv_heads, self.head_dim, list(self.buckets)]

    @property
    def dims(self) -> tuple[int, ...]:
        return (self.heads, self.kv_heads, self.head_dim)

    def flops(self, rows: int) -> int:
        """QK^T and PV over the causal (query, key) pairs of a ``rows``-token prompt."""
        return 4 * self.heads * self.head_dim * rows * (rows + 1) // 2


OpShape = ProjectionShape | AttentionShape
