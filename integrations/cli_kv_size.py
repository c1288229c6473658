"""`prefixcache kv-size`: KV-cache bytes per token and per request, MHA vs GQA vs MQA.

Pick a preset (`--model llama-70b`) or give the shape (`--layers --heads --kv-heads
--head-dim`; explicit flags override a preset's fields, `--kv-heads` defaults to `--heads`).
Sliding-window models (`--model gemma3-1b`, or `--sliding-layers N --window W`) are sized as
the engine's hybrid KV cache keeps them: a sliding layer holds at most its window per request,
so the bytes per request grow more slowly than the tokens (`by_context` shows 4K / 32K / 128K).
Prints a rich table, or JSON with `--json`. Bad input exits with code 2 and one message.
"""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Annotated, Any

import typer
from rich import box
from rich.console import Console
from rich.table import Table

from prefixcache.sizing import (
    MODEL_PRESETS,
    VALID_DTYPES,
    ModelShape,
    attention_variant_sizes,
    dtype_bytes,
    format_binary_bytes,
    format_decimal_bytes,
    model_preset,
)


def resolve_shape(
    model: str | None,
    layers: int | None,
    heads: int | None,
    kv_heads: int | None,
    head_dim: int | None,
    sliding_layers: int | None = None,
    window: int | None = None,
) -> ModelShape:
    """The shape from a preset and/or explicit fields; ValueError if incomplete or invalid."""
    if model is not None:
        base = model_preset(model)
        return ModelShape(
            num_layers=layers if layers is not None else base.num_layers,
            num_heads=heads if heads is not None else base.num_heads,
            num_kv_heads=kv_heads if kv_heads is not None else base.num_kv_heads,
            head_dim=head_dim if head_dim is not None else base.head_dim,
            sliding_layers=sliding_layers if sliding_layers is not None else base.sliding_layers,
            window=window if window is not None else base.window,
        )
    missing = [
        flag
        for flag, value in (("--layers", layers), ("--heads", heads), ("--head-dim", head_dim))
        if value is None
    ]
    if missing:
        raise ValueError(
            f"give --model ({', '.join(MODEL_PRESETS)}) or the shape; missing {', '.join(missing)}"
        )
    assert layers is not None and heads is not None and head_dim is not None
    return ModelShape(
        num_layers=layers,
        num_heads=heads,
        num_kv_heads=kv_heads if kv_heads is not None else heads,
        head_dim=head_dim,
        sliding_layers=sliding_layers or 0,
        window=window,
    )


CONTEXTS = (4096, 32768, 131072)  # the context lengths `by_context` always shows


def kv_size_report(
    shape: ModelShape, dtype: str, tokens: int, requests: int, model: str | None = None
) -> dict[str, Any]:
    """All figures the command shows, as a JSON-ready dict (exact integer bytes)."""
    if isinstance(requests, bool) or not isinstance(requests, int) or requests <= 0:
        raise ValueError(f"requests must be a positive integer, got {requests!r}")
    per_token = shape.bytes_per_token(dtype)
    per_request = shape.bytes_for_context(dtype, tokens)
    by_context = []
    for length in sorted({*CONTEXTS, tokens}):
        kept, every = shape.bytes_for_context(dtype, length), per_token * length
        by_context.append({"tokens": length, "bytes_per_request": kept,
                           "bytes_every_layer_global": every,
                           "requests_ratio": every / kept})  # fmt: skip
    variants = []
    for row in attention_variant_sizes(shape, dtype, tokens):
        variant = replace(shape, num_kv_heads=row.num_kv_heads)
        request_bytes = variant.bytes_for_context(dtype, tokens)  # windows kept, if any
        variants.append({
            "attention": row.attention,
            "num_kv_heads": row.num_kv_heads,
            "bytes_per_token": row.bytes_per_token,
            "bytes_per_request": request_bytes,
            "bytes_total": request_bytes * requests,
            "is_model": row.is_model,
        })  # fmt: skip
    return {
        "model": model,
        "num_layers": shape.num_layers,
        "num_heads": shape.num_heads,
        "num_kv_heads": shape.num_kv_heads,
        "head_dim": shape.head_dim,
        "attention": shape.attention_kind,
        "dtype": dtype,
        "bytes_per_element": float(dtype_bytes(dtype)),
        "tokens": tokens,
        "requests": requests,
        "sliding_layers": shape.sliding_layers,
        "window": shape.window,
        "bytes_per_token": per_token,
        "bytes_per_request": per_request,
        "bytes_total": per_request * requests,
        "by_context": by_context,
        "variants": variants,
    }


def _both_units(num_bytes: int) -> str:
    return f"{format_decimal_bytes(num_bytes)} / {format_binary_bytes(num_bytes)}"


def render_table(report: dict[str, Any]) -> Table:
    """A rich table: one row per attention variant; the model's own row is bold, starred."""
    name = report["model"] or "custom"
    title = (
        f"KV cache of {name}: {report['num_layers']} layers, {report['num_heads']} heads, "
        f"{report['num_kv_heads']} kv heads, head_dim {report['head_dim']}, {report['dtype']}"
    )
    tokens, requests = report["tokens"], report["requests"]
    table = Table(
        title=title,
        caption=(
            f"{tokens:,} tokens per request, {requests:,} request(s); kv = kv heads; * = the model"
        ),
        box=box.SIMPLE_HEAD,
        pad_edge=False,
        show_edge=False,
    )
    table.add_column("attn", no_wrap=True, min_width=4)
    table.add_column("kv", justify="right", no_wrap=True)
    table.add_column("B/token", justify="right", no_wrap=True)
    table.add_column("per req", justify="right", no_wrap=True)
    table.add_column("(IEC)", justify="right", no_wrap=True)
    if requests > 1:
        table.add_column("all reqs", justify="right", no_wrap=True)
        table.add_column("(IEC)", justify="right", no_wrap=True)
    table.add_column("vs *", justify="right", no_wrap=True)
    for row in report["variants"]:
        totals = [row["bytes_per_request"]] + ([row["bytes_total"]] if requests > 1 else [])
        sizes = [fmt(n) for n in totals for fmt in (format_decimal_bytes, format_binary_bytes)]
        table.add_row(
            row["attention"] + ("*" if row["is_model"] else ""),
            str(row["num_kv_heads"]),
            f"{row['bytes_per_token']:,}",
            *sizes,
            f"{row['bytes_per_token'] / report['bytes_per_token']:.3g}x",
            style="bold" if row["is_model"] else None,
        )
    return table


def render_context_table(report: dict[str, Any]) -> Table:
    """Bytes per request by context length: sliding layers keeping their window vs every
    layer keeping every token, and how many more requests the same memory holds."""
    table = Table(
        title=f"{report['sliding_layers']} of {report['num_layers']} layers slide over "
              f"{report['window']:,} tokens",
        box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False,
    )  # fmt: skip
    for name in ("tokens", "windowed", "(IEC)", "every layer", "(IEC)", "requests x"):
        table.add_column(name, justify="right", no_wrap=True)
    for row in report["by_context"]:
        kept, every = row["bytes_per_request"], row["bytes_every_layer_global"]
        table.add_row(f"{row['tokens']:,}", format_decimal_bytes(kept), format_binary_bytes(kept),
                      format_decimal_bytes(every), format_binary_bytes(every),
                      f"{row['requests_ratio']:.2f}")  # fmt: skip
    return table


def kv_size(
    model: Annotated[str | None, typer.Option(help=f"Preset: {', '.join(MODEL_PRESETS)}.")] = None,
    layers: Annotated[int | None, typer.Option(help="Number of layers.")] = None,
    heads: Annotated[int | None, typer.Option(help="Attention (query) heads.")] = None,
    kv_heads: Annotated[int | None, typer.Option(help="KV heads (default: --heads).")] = None,
    head_dim: Annotated[int | None, typer.Option(help="Head dimension.")] = None,
    sliding_layers: Annotated[int | None, typer.Option(
        help="Layers with a sliding window (they keep at most --window tokens).",
        show_default=False)] = None,
    window: Annotated[int | None, typer.Option(help="Their window, in tokens.",
                                               show_default=False)] = None,
    dtype: Annotated[str, typer.Option(help=f"KV dtype: {', '.join(VALID_DTYPES)}.")] = "bf16",
    tokens: Annotated[int, typer.Option(help="Tokens per request.")] = 4096,
    requests: Annotated[int, typer.Option(help="Concurrent requests.")] = 1,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead.")] = False,
) -> None:
    """KV-cache bytes per token and per request, MHA vs GQA vs MQA side by side."""
    try:
        shape = resolve_shape(model, layers, heads, kv_heads, head_dim, sliding_layers, window)
        report = kv_size_report(shape, dtype.strip().lower(), tokens, requests, model)
    except (TypeError, ValueError) as error:
        raise typer.BadParameter(str(error)) from None
    if as_json:
        typer.echo(json.dumps(report, indent=2))
        return
    console = Console()
    console.print(
        f"per token: {report['bytes_per_token']:,} bytes "
        f"({format_binary_bytes(report['bytes_per_token'])}); "
        f"per request ({tokens:,} tokens): {report['bytes_per_request']:,} bytes "
        f"= {_both_units(report['bytes_per_request'])}; "
        f"{requests:,} request(s): {_both_units(report['bytes_total'])}"
    )
    console.print(render_table(report))
    if shape.sliding_layers:
        console.print(render_context_table(report))


def register(app: typer.Typer) -> None:
    """Add `kv-size` to the `prefixcache` app."""
    app.command("kv-size")(kv_size)
