"""The simulator's outputs: a rich table, the ``--json`` document and a TTFT CDF plot."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
from rich import box
from rich.table import Table

from prefixcache.integrations.router.simulator import ORACLE, PolicyResult, SimConfig


def sim_document(
    results: Mapping[str, PolicyResult], config: SimConfig, trace_info: Mapping[str, Any]
) -> dict[str, Any]:
    """``{"policies": {name: summary}, "config": ..., "trace": ...}``; each summary has
    hit_rate, ttft_p50_s / p90 / p99 / mean, imbalance (max / mean busy time) and wall_s."""
    return {
        "policies": {name: result.summary() for name, result in results.items()},
        "config": {
            "replicas": config.replicas,
            "blocks_per_replica": config.blocks_per_replica,
            "block_tokens": config.block_tokens,
            "prefill_s_per_token": config.cost.prefill_s_per_token,
            "decode_s_per_token": config.cost.decode_s_per_token,
            "approx_blocks": config.approx_blocks or config.blocks_per_replica,
            "rate_scale": config.rate_scale,
            "seed": config.seed,
        },
        "trace": dict(trace_info),
    }


def sim_table(document: Mapping[str, Any]) -> Table:
    """One row per policy, with each one's hit rate as a fraction of the oracle's."""
    config, policies = document["config"], document["policies"]
    oracle = policies.get(ORACLE, {}).get("hit_rate")
    table = Table(
        title=(
            f"{config['replicas']} replicas x {config['blocks_per_replica']:,} blocks "
            f"({config['block_tokens']} tokens), arrivals x{config['rate_scale']:g}"
        ),
        caption="TTFT in s; imbalance: max / mean busy time; oracle: one cache N x as large",
        box=box.SIMPLE_HEAD,
    )
    for header in ("policy", "hit rate", "/oracle", "TTFT p50", "p90", "p99", "imbal."):
        table.add_column(header, justify="left" if header == "policy" else "right", no_wrap=True)
    for name, row in policies.items():
        share = f"{row['hit_rate'] / oracle:.3f}" if oracle else "-"
        table.add_row(
            name, f"{row['hit_rate']:.3f}", share, f"{row['ttft_p50_s']:.3f}",
            f"{row['ttft_p90_s']:.3f}", f"{row['ttft_p99_s']:.3f}", f"{row['imbalance']:.2f}",
        )  # fmt: skip
    return table


def write_json(document: Mapping[str, Any], path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(document, indent=2) + "\n", encoding="utf-8")
    return path


def plot_ttft_cdf(results: Mapping[str, PolicyResult], path: Path) -> Path:
    """Empirical TTFT CDF per policy (log time axis)."""
    figure, axes = plt.subplots(figsize=(7, 4.5))
    for name, result in results.items():
        ttft = np.sort(np.maximum(result.ttft_s, 1e-4))
        axes.step(ttft, np.arange(1, ttft.size + 1) / ttft.size, where="post", label=name)
    axes.set_xscale("log")
    axes.set_xlabel("TTFT (s)")
    axes.set_ylabel("fraction of requests")
    axes.set_title("Simulated TTFT per routing policy")
    axes.grid(alpha=0.3)
    axes.legend(loc="upper left")
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(figure)
    return path
