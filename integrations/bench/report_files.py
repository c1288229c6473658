"""Files a run leaves: one JSON (config + per-target figures in ``vllm bench serve`` field
names + per-request arrays) and one CSV row per request."""

from __future__ import annotations

import csv
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from prefixcache.integrations.bench.metrics import speedups
from prefixcache.integrations.bench.runner import TargetRun

CSV_COLUMNS = (
    "target",
    "request_id",
    "workload",
    "group",
    "prompt_tokens",
    "max_tokens",
    "output_tokens",
    "cached_tokens",
    "success",
    "error",
    "start_s",
    "ttft_ms",
    "tpot_ms",
    "itl_mean_ms",
    "e2el_ms",
    "engine_ttft_ms",
)


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000.0, 3)


def target_record(run: TargetRun) -> dict[str, Any]:
    """The JSON object of one target."""
    ok = [r for r in run.results if r.success]
    return {
        "label": run.label,
        "backend": run.kind,
        "model_id": run.model,
        "setup_error": run.setup_error,
        "interrupted": run.interrupted,
        **run.summary,
        "input_lens": [r.prompt_tokens for r in ok],
        "output_lens": [r.output_tokens for r in ok],
        "cached_lens": [r.cached_tokens for r in ok],
        "ttfts": [r.ttft for r in ok],
        "itls": [r.itls for r in ok],
        "errors": [r.error or "" for r in run.results if not r.success],
        "engine_stats": run.engine_stats,
    }


def bench_record(runs: Sequence[TargetRun], config: dict[str, Any]) -> dict[str, Any]:
    """The whole run; ``speedup_vs_baseline`` compares every target with the first."""
    record: dict[str, Any] = {**config, "targets": [target_record(run) for run in runs]}
    if len(runs) > 1:
        record["speedup_vs_baseline"] = {
            run.label: speedups(runs[0].summary, run.summary) for run in runs[1:]
        }
    return record


def write_json(record: dict[str, Any], path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    return path


def write_csv(runs: Sequence[TargetRun], path: Path) -> Path:
    """One row per request of every target (failed ones included, with their error)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=CSV_COLUMNS)
        writer.writeheader()
        for run in runs:
            origin = min((r.start for r in run.results), default=0.0)
            for r in run.results:
                itls = r.itls
                writer.writerow(
                    {
                        "target": run.label,
                        "request_id": r.request_id,
                        "workload": r.workload,
                        "group": r.group,
                        "prompt_tokens": r.prompt_tokens,
                        "max_tokens": r.max_tokens,
                        "output_tokens": r.output_tokens,
                        "cached_tokens": "" if r.cached_tokens is None else r.cached_tokens,
                        "success": r.success,
                        "error": r.error or "",
                        "start_s": round(r.start - origin, 6),
                        "ttft_ms": _blank(_ms(r.ttft)),
                        "tpot_ms": _blank(_ms(r.tpot)),
                        "itl_mean_ms": _blank(_ms(sum(itls) / len(itls)) if itls else None),
                        "e2el_ms": _blank(_ms(r.e2el)),
                        "engine_ttft_ms": _blank(_ms(r.engine_ttft)),
                    }
                )
    return path


def _blank(value: float | None) -> float | str:
    return "" if value is None else value
