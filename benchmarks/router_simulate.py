"""Routing policies on the shipped Mooncake trace, simulated: hit rate against the oracle,
TTFT p90 against round robin, load imbalance, for 8 and 64 replicas.

    python benchmarks/router_simulate.py [--json results/router_simulate.json]

Each replica is a real ``PrefixCache`` with a cost model and a FIFO queue (``prefixcache
simulate``); 8 replicas replay the trace 2.5x faster than recorded, 64 replicas 20x faster,
each with the trace's working set split evenly among them.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
from bench_report import write_json

from prefixcache.integrations.router.mooncake_trace import load_mooncake
from prefixcache.integrations.router.scoring import CostModel
from prefixcache.integrations.router.simulator import (
    ORACLE,
    SIM_POLICIES,
    SimConfig,
    simulate_all,
    working_set_blocks,
)

TRACE = Path(__file__).parent / "traces" / "mooncake_synthetic_trace.jsonl.gz"
SETUPS = ((8, 2.5), (64, 20.0))  # (replicas, rate scale)
ROUND_ROBIN = "round_robin"


def compare(replicas: int, rate_scale: float, limit: int | None) -> dict[str, Any]:
    """Every policy's figures on ``replicas`` replicas, against the oracle and round robin."""
    trace = load_mooncake(TRACE, limit, 512)
    working_set = working_set_blocks(trace)
    config = SimConfig(replicas=replicas, blocks_per_replica=max(1, -(-working_set // replicas)),
                       block_tokens=512, cost=CostModel(1 / 20000, 1 / 2000),
                       rate_scale=rate_scale)  # fmt: skip
    results = {name: r.summary() for name, r in
               simulate_all(trace, config, [ORACLE, *SIM_POLICIES]).items()}  # fmt: skip
    oracle, baseline = results[ORACLE], results[ROUND_ROBIN]
    rows = {}
    for name, result in results.items():
        rows[name] = {
            "hit_rate": round(result["hit_rate"], 3),
            "hit_over_oracle": round(result["hit_rate"] / oracle["hit_rate"], 3),
            "ttft_p90_s": round(result["ttft_p90_s"], 3),
            "p90_times_lower_than_round_robin": round(
                baseline["ttft_p90_s"] / result["ttft_p90_s"], 2),
            "imbalance": round(result["imbalance"], 2),
        }
    return {"replicas": replicas, "rate_scale": rate_scale, "requests": len(trace),
            "blocks_per_replica": config.blocks_per_replica, "policies": rows}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--limit", type=int, default=None, help="first K requests only")
    parser.add_argument("--json", default="results/router_simulate.json")
    args = parser.parse_args()
    report: dict[str, Any] = {"trace": TRACE.name}
    for replicas, rate_scale in SETUPS:
        report[f"replicas_{replicas}"] = compare(replicas, rate_scale, args.limit)
        for name, row in report[f"replicas_{replicas}"]["policies"].items():
            print(f"{replicas:3d} replicas {name:20s} {row}")
    write_json(args.json, report)


if __name__ == "__main__":
    main()
