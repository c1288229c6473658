"""The shipped Mooncake trace replayed on the embedded engine at the trace's timestamps, cache
off then on: hit rate, TTFT and throughput (``prefixcache bench --workload mooncake``).

    python benchmarks/mooncake_replay.py [--limit 1000] [--json results/mooncake_replay.json]

SmolLM2 on this machine's cores; every 512-token trace block shrunk to ``--block-tokens``
tokens so prompts fit the model; arrivals ``--rate-scale`` times faster than recorded (by
default faster than two cores serve them, so TTFT is mostly queueing).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
from bench_report import write_json

TRACE = Path(__file__).parent / "traces" / "mooncake_synthetic_trace.jsonl.gz"


def replay(limit: int, block_tokens: int, output_len: int, rate_scale: float) -> dict[str, Any]:
    """One ``prefixcache bench`` run (cache off, then on) and its targets' figures."""
    with tempfile.TemporaryDirectory() as folder:
        command = [sys.executable, "-m", "prefixcache.integrations.cli", "bench",
                   "--workload", "mooncake", str(TRACE), "--limit", str(limit),
                   "--block-tokens", str(block_tokens), "--output-len", str(output_len),
                   "--rate-scale", str(rate_scale), "--output-dir", folder, "--no-plots",
                   "--no-progress"]  # fmt: skip
        subprocess.run(command, check=True, capture_output=True, text=True)
        record = json.loads((Path(folder) / "bench.json").read_text())
    rows = {}
    for target in record["targets"]:
        rows[target["label"]] = {
            "completed": target["completed"],
            "hit_rate": round(target.get("prefix_cache_hit_rate") or 0.0, 3),
            "ttft_p50_s": round(target["p50_ttft_ms"] / 1e3, 2),
            "ttft_mean_s": round(target["mean_ttft_ms"] / 1e3, 2),
            "requests_per_s": round(target["request_throughput"], 1),
        }
    off, on = rows["cache off"], rows["cache on"]
    return {"requests": limit, "block_tokens": block_tokens, "output_len": output_len,
            "rate_scale": rate_scale, "targets": rows,
            "ttft_p50_off_over_on": round(off["ttft_p50_s"] / on["ttft_p50_s"], 2),
            "ttft_mean_off_over_on": round(off["ttft_mean_s"] / on["ttft_mean_s"], 2)}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--limit", type=int, default=1000)
    parser.add_argument("--block-tokens", type=int, default=4)
    parser.add_argument("--output-len", type=int, default=2)
    parser.add_argument("--rate-scale", type=float, default=10.0)
    parser.add_argument("--json", default="results/mooncake_replay.json")
    args = parser.parse_args()
    report = replay(args.limit, args.block_tokens, args.output_len, args.rate_scale)
    print(report)
    write_json(args.json, report)


if __name__ == "__main__":
    main()
