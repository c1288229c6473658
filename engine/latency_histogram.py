"""A latency histogram the KV tiers fill as they load and store blocks, read out by ``stats()``
(and so by the server's ``/metrics`` as Prometheus histograms). Observed by one thread per
histogram (the engine thread, or a tier's own thread), read by any: a snapshot may be one
observation behind, never torn."""

from __future__ import annotations

import bisect
from typing import Any

# seconds: a host-tier copy takes ~0.1-10 ms, a disk or store read of a long prefix ~10-500 ms
TIER_LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
                        2.5, 5.0)  # fmt: skip


class LatencyHistogram:
    """Counts of observed seconds per bucket (upper bounds ``buckets``, then +Inf), their sum
    and how many blocks the observed operations moved."""

    def __init__(self, buckets: tuple[float, ...] = TIER_LATENCY_BUCKETS) -> None:
        self.buckets = buckets
        self.counts = [0] * (len(buckets) + 1)
        self.sum = 0.0
        self.blocks = 0

    def observe(self, seconds: float, blocks: int = 0) -> None:
        self.counts[bisect.bisect_left(self.buckets, seconds)] += 1
        self.sum += seconds
        self.blocks += blocks

    @property
    def count(self) -> int:
        return sum(self.counts)

    def snapshot(self) -> dict[str, Any]:
        """``{"buckets": [[upper bound, cumulative count], ...], "count", "sum", "blocks"}``
        (the last bound is ``"+Inf"``), as Prometheus lays a histogram out."""
        counts = list(self.counts)
        cumulative, total = [], 0
        for bound, count in zip([*self.buckets, "+Inf"], counts, strict=True):
            total += count
            cumulative.append([bound, total])
        return {"buckets": cumulative, "count": total, "sum": self.sum, "blocks": self.blocks}
