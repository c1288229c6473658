"""PNG plots: the TTFT distribution per target (e.g. cache on vs off) and TTFT vs prompt
length. Matplotlib's Agg backend: no display needed."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np

from prefixcache.integrations.bench.runner import TargetRun


def plot_ttft_distribution(runs: Sequence[TargetRun], path: Path) -> Path:
    """Empirical CDF of TTFT (ms) per target."""
    figure, axes = plt.subplots(figsize=(7, 4.5))
    for run in runs:
        ttfts = np.sort([r.ttft * 1000.0 for r in run.results if r.success and r.ttft])
        if ttfts.size:
            fractions = np.arange(1, ttfts.size + 1) / ttfts.size
            axes.step(ttfts, fractions, where="post", label=f"{run.label} (n={ttfts.size})")
    axes.set_xlabel("TTFT (ms)")
    axes.set_ylabel("fraction of requests")
    axes.set_title("TTFT distribution")
    axes.grid(alpha=0.3)
    _legend(axes, "lower right")
    return _save(figure, path)


def plot_ttft_vs_prompt_len(runs: Sequence[TargetRun], path: Path) -> Path:
    """TTFT (ms) against prompt tokens, one marker colour per target."""
    figure, axes = plt.subplots(figsize=(7, 4.5))
    for run in runs:
        ok = [r for r in run.results if r.success and r.ttft]
        axes.scatter(
            [r.prompt_tokens for r in ok],
            [r.ttft * 1000.0 for r in ok],
            s=16,
            alpha=0.75,
            label=run.label,
        )
    axes.set_xlabel("prompt tokens")
    axes.set_ylabel("TTFT (ms)")
    axes.set_title("TTFT vs prompt length")
    axes.grid(alpha=0.3)
    _legend(axes, "upper left")
    return _save(figure, path)


def _legend(axes: plt.Axes, where: str) -> None:
    """A legend, or a note when no request succeeded (nothing to plot)."""
    if axes.get_legend_handles_labels()[0]:
        axes.legend(loc=where)
    else:
        axes.text(0.5, 0.5, "no successful requests", ha="center", transform=axes.transAxes)


def _save(figure: plt.Figure, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path
