"""`prefixcache doctor`: what this CPU offers the engine, and which kernels it runs per row count.

Prints the CPU's model and the flags the kernels care about, torch's and oneDNN's view of it,
whether the compiled kernel libraries load (and why not), the machine's measured ceilings
(``bf16_dot_peak``, ``f32_fma_peak``, and oneDNN's best bf16 GEMM rate, which reaches AMX tiles
where the CPU has them), then times the compiled kernels against the libraries (oneDNN for the
projections, SDPA for the prefill attention) on the model's own shapes at every row-count bucket
and shows what the engine chooses (``prefixcache.kernels.cpu.kernel_choice``). The fresh
measurement replaces the cached one unless ``PREFIXCACHE_KERNEL_CHOICE`` forces a choice.
``--json PATH`` writes every figure.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Annotated, Any

import typer
from rich import box
from rich.console import Console
from rich.table import Table

FLAGS_THAT_MATTER = (
    "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_vnni",
    "avx512_bf16", "avx512_fp16", "avx_ne_convert", "amx_tile", "amx_bf16", "amx_int8",
)  # fmt: skip


def _onednn_gemm_rate(dtype: Any, rows: int = 1024, out: int = 3072, inner: int = 1024) -> float:
    """GFLOP/s of oneDNN's packed GEMM on a hot [rows, inner] x [inner, out] (best of 5)."""
    import torch

    from prefixcache.kernels.cpu.gemm_candidates import onednn_linear, onednn_pack

    x = torch.randn(rows, inner).to(dtype)
    packed = onednn_pack(torch.randn(out, inner).to(dtype))
    onednn_linear(x, packed, out, None)
    best = float("inf")
    for _ in range(5):
        start = time.perf_counter()
        onednn_linear(x, packed, out, None)
        best = min(best, time.perf_counter() - start)
    return 2 * rows * out * inner / best / 1e9


def machine_report() -> dict[str, Any]:
    """The CPU, torch, the kernel libraries and the measured ceilings, JSON-ready."""
    import torch

    from prefixcache.kernels.cpu import peak_rates
    from prefixcache.kernels.cpu.build import F32_LIBRARY, cpu_flags, unavailable_reason
    from prefixcache.kernels.cpu.gemm_candidates import onednn_supports
    from prefixcache.kernels.cpu.kernel_choice import cpu_model

    flags = cpu_flags()
    libraries = {
        "bf16 (AVX-512 BF16)": unavailable_reason(),
        "float32 (AVX2/FMA)": unavailable_reason(F32_LIBRARY),
    }
    peaks: dict[str, float | None] = {
        "bf16_dot_peak": None if libraries["bf16 (AVX-512 BF16)"] else peak_rates.bf16_dot_peak(),
        "f32_fma_peak": None if libraries["float32 (AVX2/FMA)"] else peak_rates.f32_fma_peak(),
        "onednn_bf16_gemm": (
            _onednn_gemm_rate(torch.bfloat16) if onednn_supports(torch.bfloat16) else None
        ),
        "onednn_f32_gemm": (
            _onednn_gemm_rate(torch.float32) if onednn_supports(torch.float32) else None
        ),
    }
    return {
        "cpu": cpu_model(),
        "threads": torch.get_num_threads(),
        "flags": {flag: flag in flags for flag in FLAGS_THAT_MATTER},
        "amx": "amx_bf16" in flags and "amx_tile" in flags,
        "torch": torch.__version__,
        "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "onednn": torch.backends.mkldnn.is_available(),
        "onednn_bf16": onednn_supports(torch.bfloat16),
        "libraries": {name: reason or "loaded" for name, reason in libraries.items()},
        "peaks_gflops": peaks,
    }


def choice_report(model_name: str) -> dict[str, Any]:
    """The model's ops timed on both implementations at every bucket, and what the engine runs."""
    from prefixcache.engine.model_registry import load_model
    from prefixcache.kernels.cpu.kernel_choice import choose_kernels, current_policy
    from prefixcache.kernels.cpu.kernel_timing import measure_op

    loaded = load_model(model_name)
    model = loaded.model
    shapes = model.op_shapes()
    dtype = model.dtype
    policy = current_policy()
    if policy.mode == "measured" and shapes:  # measured again, cached, and what runs
        model.apply_kernel_choice(choose_kernels(shapes, dtype, remeasure=True))
        seconds = model.kernel_choice.seconds
    else:  # a forced choice runs: time the candidates for the table only
        seconds = {s.name: measure_op(s, dtype) for s in shapes}
    running = model.kernel_choice
    rows = []
    for shape in shapes:
        for bucket, times in seconds[shape.name].items():
            flops = shape.flops(bucket)
            runs = running.implementation(shape.name, bucket) if running else "compiled"
            rows.append({
                "op": shape.name, "shape": list(shape.dims),
                "rows": bucket, "seconds": times, "runs": runs,
                "gflops": {name: flops / t / 1e9 for name, t in times.items()},
            })  # fmt: skip
    return {
        "model": model_name,
        "dtype": str(dtype).removeprefix("torch."),
        "policy": str(policy),
        "summary": running.summary() if running else "no choice: one kernel runs each op here",
        "source": running.source if running else None,
        "rows": rows,
    }


def render(machine: dict[str, Any], choice: dict[str, Any] | None, console: Console) -> None:
    flags = " ".join(f for f, present in machine["flags"].items() if present)
    console.print(f"[bold]CPU[/bold] {machine['cpu']}, {machine['threads']} threads; AMX: "
                  f"{'yes' if machine['amx'] else 'no'}")  # fmt: skip
    console.print(f"flags: {flags}")
    console.print(
        f"torch {machine['torch']} (CPU capability {machine['torch_cpu_capability']}), oneDNN "
        f"{'yes' if machine['onednn'] else 'no'}, oneDNN bf16 "
        f"{'yes' if machine['onednn_bf16'] else 'no'}"
    )
    for name, state in machine["libraries"].items():
        console.print(f"compiled kernels, {name}: {state}")
    peaks = machine["peaks_gflops"]
    console.print("ceilings, GFLOP/s: " + ", ".join(
        f"{name} {value:.0f}" for name, value in peaks.items() if value is not None
    ))  # fmt: skip
    if choice is None:
        return
    peak = peaks["bf16_dot_peak"] if choice["dtype"] == "bfloat16" else peaks["f32_fma_peak"]
    table = Table(
        title=f"kernels per row count: {choice['model']} ({choice['dtype']}), "
        f"policy {choice['policy']}",
        caption=f"ratio: library / ours; runs: {choice['summary']} ({choice['source']})",
        box=box.SIMPLE_HEAD,
    )
    for column in ("op", "rows", "ours ms", "library ms", "library", "ratio", "runs",
                   "GFLOP/s", "of peak"):  # fmt: skip
        justify = "left" if column in ("op", "runs", "library") else "right"
        table.add_column(column, justify=justify, no_wrap=True)
    previous = None
    for row in choice["rows"]:
        times, rate = row["seconds"], row["gflops"].get(row["runs"])
        library = next((name for name in times if name != "compiled"), None)
        ratio = times[library] / times["compiled"] if library and "compiled" in times else None
        label = f"{row['op']} {'x'.join(map(str, row['shape']))}"
        table.add_row(
            label if label != previous else "", str(row["rows"]),
            *(f"{times[n] * 1e3:.3f}" if n in times else "-" for n in ("compiled", library)),
            library or "-", f"{ratio:.2f}" if ratio else "-", row["runs"],
            f"{rate:.0f}" if rate else "-", f"{rate / peak:.0%}" if rate and peak else "-",
        )  # fmt: skip
        previous = label
    console.print(table)


def register(app: typer.Typer) -> None:
    @app.command()
    def doctor(
        model: Annotated[str, typer.Option(help="model whose op shapes are timed")] = (
            "smollm2"
        ),
        machine_only: Annotated[
            bool, typer.Option("--machine-only", help="skip the kernel timing")
        ] = False,
        json_path: Annotated[
            Path | None, typer.Option("--json", help="also write every figure here")
        ] = None,
    ) -> None:
        """What this CPU offers the engine, and which kernel runs each op per row count."""
        console = Console()
        try:
            machine = machine_report()
            choice = None if machine_only else choice_report(model)
        except ValueError as error:
            console.print(f"error: {error}", style="red")
            raise typer.Exit(2) from error
        render(machine, choice, console)
        if json_path is not None:
            json_path.parent.mkdir(parents=True, exist_ok=True)
            json_path.write_text(json.dumps({"machine": machine, "kernels": choice}, indent=1))
