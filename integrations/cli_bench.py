"""`prefixcache bench`: TTFT benchmark of the prefix cache, in process or against URLs.

With no arguments: the embedded SmolLM2 on this machine, the agent + RAG workload, prefix
caching off vs on, sequential requests; a table in the terminal and JSON, CSV and PNG plots
under results/bench/. Bad input exits with code 2 and one message, before anything runs or
is written: bad options, output paths that cannot be written, an embedded model (or engine
option such as --dtype, --num-blocks) that does not load, a bad --url or --timeout. A run in
which no request succeeded exits with code 1 and Ctrl-C with 130, each after printing and
writing what was measured.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

SIZE_HELP = "Workload size (applies to every selected workload that has it)."


def _cache_modes(text: str) -> tuple[bool, ...]:
    modes = {"on": True, "off": False}
    parts = [part.strip().lower() for part in text.split(",") if part.strip()]
    if not parts or any(part not in modes for part in parts) or len(set(parts)) != len(parts):
        raise ValueError(f"--cache takes on, off, 'off,on' or 'on,off'; got {text!r}")
    return tuple(modes[part] for part in parts)


def _llm_kwargs(**given: object) -> dict[str, object]:
    """The engine options the user gave (None = not given), passed through unchanged so the
    engine validates them (``--num-blocks 0`` is an error, not the default pool)."""
    return {name: value for name, value in given.items() if value is not None}


def bench(
    trace_file: Annotated[
        Path | None, typer.Argument(help="JSONL file for --workload trace, or a Mooncake trace "
                                    "(.jsonl or .jsonl.gz) for --workload mooncake.",
                                    show_default=False)
    ] = None,
    workload: Annotated[
        str,
        typer.Option(help="shared-prefix, rag, agent, prefix-repetition, a comma list; or "
                          "trace / mooncake with a FILE."),
    ] = "agent,rag",
    target: Annotated[
        list[str] | None, typer.Option(help="embedded (default unless --url is given).")
    ] = None,
    url: Annotated[
        list[str] | None, typer.Option(help="OpenAI-compatible base URL (repeatable).")
    ] = None,
    cache: Annotated[str, typer.Option(help="Embedded prefix caching: off,on / on / off.")] = (
        "off,on"
    ),
    model: Annotated[str, typer.Option(help="Embedded model: smollm2, HF folder, .gguf.")] = (
        "smollm2"
    ),
    served_model: Annotated[
        str | None, typer.Option(help="Model name for --url (default: from /v1/models).")
    ] = None,
    concurrency: Annotated[
        int | None, typer.Option(help="Requests in flight (default 1: sequential).")
    ] = None,
    request_rate: Annotated[
        float | None, typer.Option(help="Open loop: requests per second (Poisson).")
    ] = None,
    burstiness: Annotated[float, typer.Option(help="Gamma shape of arrivals; <1 burstier.")] = (
        1.0
    ),
    slo: Annotated[str | None, typer.Option(help="Goodput SLO, e.g. ttft:500,tpot:100.")] = None,
    seed: Annotated[int, typer.Option(help="Workload and arrival seed.")] = 0,
    vocab_size: Annotated[
        int | None,
        typer.Option(
            help="Synthetic token ids are drawn below this (default: 32000, capped at the "
            "embedded model's vocabulary).",
            show_default=False,
        ),
    ] = None,
    output_len: Annotated[int | None, typer.Option(help=SIZE_HELP)] = None,
    system_len: Annotated[int | None, typer.Option(help=SIZE_HELP)] = None,
    question_len: Annotated[int | None, typer.Option(help=SIZE_HELP)] = None,
    groups: Annotated[int | None, typer.Option(help="shared-prefix: groups.")] = None,
    prompts_per_group: Annotated[int | None, typer.Option(help="shared-prefix.")] = None,
    queries: Annotated[int | None, typer.Option(help="rag: number of queries.")] = None,
    documents: Annotated[int | None, typer.Option(help="rag: document pool.")] = None,
    chunks: Annotated[int | None, typer.Option(help="rag: chunks per query.")] = None,
    chunk_len: Annotated[int | None, typer.Option(help="rag: tokens per chunk.")] = None,
    zipf: Annotated[float | None, typer.Option(help="rag: Zipf exponent.")] = None,
    fixed_order: Annotated[bool, typer.Option(help="rag: chunks sorted, not shuffled.")] = False,
    sessions: Annotated[int | None, typer.Option(help="agent: sessions.")] = None,
    turns: Annotated[int | None, typer.Option(help="agent: turns per session.")] = None,
    user_len: Annotated[int | None, typer.Option(help="agent: first user message.")] = None,
    tool_call_len: Annotated[int | None, typer.Option(help="agent: tool call tokens.")] = None,
    tool_result_len: Annotated[int | None, typer.Option(help="agent: tool result.")] = None,
    num_prompts: Annotated[int | None, typer.Option(help="prefix-repetition: prompts.")] = None,
    num_prefixes: Annotated[int | None, typer.Option(help="prefix-repetition.")] = None,
    prefix_len: Annotated[int | None, typer.Option(help="prefix-repetition.")] = None,
    suffix_len: Annotated[int | None, typer.Option(help="prefix-repetition.")] = None,
    limit: Annotated[int | None, typer.Option(help="mooncake: first K requests.")] = None,
    rate_scale: Annotated[float | None, typer.Option(
        help="mooncake: arrivals this many times faster than the trace's.")] = None,
    block_tokens: Annotated[int | None, typer.Option(
        help="mooncake: tokens per trace block (512; fewer shrink prompts).")] = None,
    num_blocks: Annotated[int | None, typer.Option(help="Embedded KV pool blocks.")] = None,
    kv_host_memory: Annotated[str | None, typer.Option(
        help="Embedded host-memory KV tier (bytes or a size such as 8GiB).")] = None,
    kv_disk_dir: Annotated[str | None, typer.Option(
        help="Embedded persistent disk KV tier directory.")] = None,
    kv_disk_size: Annotated[str | None, typer.Option(
        help="Bytes the embedded disk tier may hold (default 10GiB).")] = None,
    kv_remote: Annotated[str | None, typer.Option(
        help="Embedded: a KV tier shared in Redis/Valkey (redis://host:port).")] = None,
    kv_tier_dtype: Annotated[str | None, typer.Option(
        help="Embedded tiers' dtype: auto (exact), fp8 or int8.")] = None,
    dtype: Annotated[str | None, typer.Option(help="Embedded dtype (bf16, float32).")] = None,
    device: Annotated[str | None, typer.Option(help="Embedded device: cpu, cuda.")] = None,
    timeout: Annotated[float, typer.Option(help="Per-request timeout for --url (s).")] = 300.0,
    api_key: Annotated[
        str | None, typer.Option(help="Bearer token for --url servers that need one.")
    ] = None,
    output_dir: Annotated[Path, typer.Option(help="Where JSON, CSV, PNGs go.")] = Path(
        "results/bench"
    ),
    save_requests: Annotated[
        Path | None, typer.Option(help="Also write the request list (JSONL, replayable).")
    ] = None,
    plots: Annotated[bool, typer.Option(help="Write the PNG plots.")] = True,
    progress: Annotated[bool, typer.Option(help="Show a progress bar.")] = True,
    warmup: Annotated[bool, typer.Option(help="Embedded: one tiny request first.")] = True,
) -> None:
    """TTFT benchmark: cache off vs on in process, or any OpenAI-compatible URL."""
    from prefixcache.integrations.bench.bench_session import BenchOptions, run_bench
    from prefixcache.integrations.bench.load_generator import LoadConfig
    from prefixcache.integrations.bench.metrics import Slo

    sizes = {
        "output_len": output_len,
        "system_len": system_len,
        "question_len": question_len,
        "num_groups": groups,
        "prompts_per_group": prompts_per_group,
        "num_queries": queries,
        "num_documents": documents,
        "chunks_per_query": chunks,
        "chunk_len": chunk_len,
        "zipf_exponent": zipf,
        "shuffle_chunks": False if fixed_order else None,
        "num_sessions": sessions,
        "turns_per_session": turns,
        "user_len": user_len,
        "call_len": tool_call_len,
        "result_len": tool_result_len,
        "num_prompts": num_prompts,
        "num_prefixes": num_prefixes,
        "prefix_len": prefix_len,
        "suffix_len": suffix_len,
        "limit": limit,
        "rate_scale": rate_scale,
        "block_tokens": block_tokens,
    }
    try:
        targets = [t.strip().lower() for t in (target or [])]
        if any(t != "embedded" for t in targets):
            raise ValueError("--target takes 'embedded' (use --url URL for a server)")
        embedded = bool(targets) or not url
        if device is not None:
            from prefixcache.engine.devices import resolve_device

            resolve_device(device)  # a bad name fails here, not once per request
        llm_kwargs = _llm_kwargs(num_blocks=num_blocks, dtype=dtype, device=device,
                                 kv_host_memory=kv_host_memory, kv_disk_dir=kv_disk_dir,
                                 kv_disk_size=kv_disk_size, kv_remote=kv_remote,
                                 kv_tier_dtype=kv_tier_dtype)  # fmt: skip
        options = BenchOptions(
            workload=workload,
            trace_file=trace_file,
            seed=seed,
            vocab_size=vocab_size,
            sizes=sizes,
            model=model,
            cache_modes=_cache_modes(cache) if embedded else (),
            llm_kwargs=llm_kwargs,
            urls=tuple(url or ()),
            url_model=served_model,
            timeout_s=timeout,
            api_key=api_key,
            load=LoadConfig(concurrency, request_rate, burstiness, seed),
            slo=Slo.parse(slo) if slo else None,
            output_dir=output_dir,
            save_requests=save_requests,
            plots=plots,
            progress=progress,
            warmup=warmup,
        )
        outcome = run_bench(options)
    except (TypeError, ValueError) as error:
        raise typer.BadParameter(str(error)) from None
    if outcome.interrupted:
        raise typer.Exit(130)  # the shell's code for Ctrl-C, after the partial report
    if not any(run.summary["completed"] for run in outcome.runs):
        raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    """Add `bench` to the `prefixcache` app."""
    app.command("bench")(bench)
