"""Workloads by name, built from one seed and a shared set of size overrides.

``build_requests("agent,rag", ...)`` interleaves several workloads into one request list.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from prefixcache.integrations.bench.bench_request import BenchRequest, interleave
from prefixcache.integrations.bench.token_source import TokenRange
from prefixcache.integrations.bench.workload_agent import AgentConfig, build_agent
from prefixcache.integrations.bench.workload_mooncake import MooncakeReplay, load_mooncake_requests
from prefixcache.integrations.bench.workload_prefix_repetition import (
    PrefixRepetitionConfig,
    build_prefix_repetition,
)
from prefixcache.integrations.bench.workload_rag import RagConfig, build_rag
from prefixcache.integrations.bench.workload_shared_prefix import (
    SharedPrefixConfig,
    build_shared_prefix,
)
from prefixcache.integrations.bench.workload_trace import load_trace

SYNTHETIC_WORKLOADS: dict[str, tuple[type, Any]] = {
    "shared-prefix": (SharedPrefixConfig, build_shared_prefix),
    "rag": (RagConfig, build_rag),
    "agent": (AgentConfig, build_agent),
    "prefix-repetition": (PrefixRepetitionConfig, build_prefix_repetition),
}
TRACE_WORKLOADS = ("trace", "mooncake")
MOONCAKE_OPTIONS = {f.name for f in dataclasses.fields(MooncakeReplay)}
WORKLOAD_NAMES = (*SYNTHETIC_WORKLOADS, *TRACE_WORKLOADS)
DEFAULT_WORKLOAD = "agent,rag"


def workload_config(name: str, overrides: dict[str, Any]) -> Any:
    """The config of ``name`` with every override that names one of its fields applied
    (None values are ignored). ValueError for invalid values."""
    config_type, _ = SYNTHETIC_WORKLOADS[name]
    fields = {f.name for f in dataclasses.fields(config_type)}
    return config_type(**{k: v for k, v in overrides.items() if k in fields and v is not None})


def build_requests(
    workload: str,
    seed: int,
    tokens: TokenRange,
    overrides: dict[str, Any] | None = None,
    trace_file: Path | None = None,
) -> list[BenchRequest]:
    """The request list of ``workload`` (comma-separated names, or ``trace`` with a file).
    ValueError names an unknown workload or a bad size."""
    names = [name.strip() for name in workload.split(",") if name.strip()]
    if not names:
        raise ValueError(f"no workload given; choose from {', '.join(WORKLOAD_NAMES)}")
    unknown = [name for name in names if name not in WORKLOAD_NAMES]
    if unknown:
        raise ValueError(
            f"unknown workload {unknown[0]!r}; choose from {', '.join(WORKLOAD_NAMES)}"
        )
    traced = [name for name in names if name in TRACE_WORKLOADS]
    if traced:
        if len(names) != 1:
            raise ValueError(f"the {traced[0]} workload cannot be mixed with others")
        if trace_file is None:
            raise ValueError(f"--workload {traced[0]} needs a trace FILE argument")
        if traced[0] == "mooncake":
            given = {k: v for k, v in (overrides or {}).items()
                     if k in MOONCAKE_OPTIONS and v is not None}  # fmt: skip
            return load_mooncake_requests(trace_file, seed, tokens, MooncakeReplay(**given))
        return load_trace(trace_file, seed, tokens)
    if trace_file is not None:
        raise ValueError(f"a trace file was given but the workload is {workload!r}")
    lists = []
    for name in names:
        _, build = SYNTHETIC_WORKLOADS[name]
        lists.append(build(workload_config(name, overrides or {}), seed, tokens))
    return interleave(*lists)
