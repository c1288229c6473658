"""`prefixcache simulate TRACE`: replay a Mooncake-format trace against N simulated replicas
(each a real prefix cache, no model) per routing policy, with the oracle of one cache N times
as large; prints a table, writes ``--json`` and a ``--plot`` of TTFT CDFs. Bad input exits
with code 2 and one message."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

POLICY_HELP = "Routing policy (repeatable): cache_aware, cache_aware_approx, session_hash, " \
    "least_load, round_robin, random, oracle. Default: all."  # fmt: skip
CAPACITY_HELP = "Cache capacity per replica in trace blocks (default: the trace's working set " \
    "/ replicas)."  # fmt: skip


def simulate(
    trace_file: Annotated[Path, typer.Argument(help="Mooncake-format JSONL trace.")],
    replicas: Annotated[int, typer.Option(help="Simulated replicas.")] = 8,
    blocks_per_replica: Annotated[
        int | None,
        typer.Option(help=CAPACITY_HELP),
    ] = None,
    policy: Annotated[list[str] | None, typer.Option(help=POLICY_HELP)] = None,
    prefill_tokens_per_s: Annotated[
        float, typer.Option(help="Replica prefill speed (uncached tokens a second).")
    ] = 20000.0,
    decode_tokens_per_s: Annotated[
        float, typer.Option(help="Replica decode throughput (batched tokens a second).")
    ] = 2000.0,
    rate_scale: Annotated[float, typer.Option(help="Replay arrivals this many times faster.")] = (
        1.0
    ),
    approx_blocks: Annotated[
        int | None, typer.Option(help="Shadow-tree capacity of cache_aware_approx.")
    ] = None,
    block_tokens: Annotated[int, typer.Option(help="Tokens per trace block.")] = 512,
    limit: Annotated[int | None, typer.Option(help="Replay only the first K requests.")] = None,
    seed: Annotated[int, typer.Option(help="Seed of the random policy.")] = 0,
    json_out: Annotated[Path | None, typer.Option("--json", help="Write the results here.")] = (
        None
    ),
    plot: Annotated[Path | None, typer.Option(help="Write a TTFT CDF plot (PNG) here.")] = None,
) -> None:
    """Hit rate, TTFT p50/p90/p99 and load imbalance of routing policies on a trace."""
    from rich.console import Console

    from prefixcache.integrations.router.mooncake_trace import TraceFormatError, load_mooncake
    from prefixcache.integrations.router.scoring import CostModel
    from prefixcache.integrations.router.sim_report import (
        plot_ttft_cdf,
        sim_document,
        sim_table,
        write_json,
    )
    from prefixcache.integrations.router.simulator import (
        ORACLE,
        SIM_POLICIES,
        SimConfig,
        simulate_all,
        working_set_blocks,
    )

    console = Console()
    names = policy or [ORACLE, *SIM_POLICIES]
    try:
        unknown = [name for name in names if name not in (ORACLE, *SIM_POLICIES)]
        if unknown:
            known = ", ".join((*SIM_POLICIES, ORACLE))
            raise ValueError(f"unknown policy {unknown[0]!r}; choose from {known}")
        if replicas < 1:
            raise ValueError(f"--replicas must be >= 1, got {replicas}")
        if limit is not None and limit < 1:
            raise ValueError(f"--limit must be >= 1, got {limit}")
        for flag, value in (("--prefill-tokens-per-s", prefill_tokens_per_s),
                            ("--decode-tokens-per-s", decode_tokens_per_s)):  # fmt: skip
            if not value > 0:
                raise ValueError(f"{flag} must be > 0, got {value}")
        trace = load_mooncake(trace_file, limit, block_tokens)
        working_set = working_set_blocks(trace)
        config = SimConfig(
            replicas=replicas,
            blocks_per_replica=blocks_per_replica or max(1, -(-working_set // replicas)),
            block_tokens=block_tokens,
            cost=CostModel(1.0 / prefill_tokens_per_s, 1.0 / decode_tokens_per_s),
            approx_blocks=approx_blocks,
            rate_scale=rate_scale,
            seed=seed,
        )
    except (ValueError, TraceFormatError) as error:
        console.print(f"[red]error:[/red] {error}")
        raise typer.Exit(2) from None
    results = simulate_all(
        trace, config, names, progress=lambda name: console.log(f"simulating {name}")
    )
    document = sim_document(results, config, {
        "path": str(trace_file), "requests": len(trace), "working_set_blocks": working_set,
        "duration_s": trace[-1].arrival_s - trace[0].arrival_s,
    })  # fmt: skip
    console.print(sim_table(document))
    if json_out is not None:
        console.print(f"wrote {write_json(document, json_out)}")
    if plot is not None:
        console.print(f"wrote {plot_ttft_cdf(results, plot)}")


def register(app: typer.Typer) -> None:
    app.command("simulate")(simulate)
