"""`prefixcache serve`: the OpenAI-compatible server on a model, with uvicorn.

    prefixcache serve --model smollm2 --host 127.0.0.1 --port 8000 [--api-key KEY]

The key can also come from the PREFIXCACHE_API_KEY environment variable (kept out of the
process list). Bad options exit with code 2 and one message.
"""

from __future__ import annotations

from typing import Annotated

import typer


def serve(
    model: Annotated[str, typer.Option(help="'smollm2', a Hugging Face folder or a .gguf.")]
    = "smollm2",
    host: Annotated[str, typer.Option(help="Interface to bind.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="TCP port.", min=1, max=65535)] = 8000,
    api_key: Annotated[str | None, typer.Option(
        envvar="PREFIXCACHE_API_KEY", help="Require this bearer key (all routes but /health).",
        show_default=False)] = None,
    served_model_name: Annotated[str | None, typer.Option(
        help="The model id clients send (default: --model).")] = None,
    block_size: Annotated[int, typer.Option(help="Tokens per KV block.", min=1)] = 16,
    num_blocks: Annotated[int | None, typer.Option(help="KV blocks (default: from memory).",
                                                   min=1)] = None,
    kv_cache_memory: Annotated[int | None, typer.Option(help="KV pool bytes.", min=1)] = None,
    max_model_len: Annotated[int | None, typer.Option(help="Context length cap.", min=2)] = None,
    dtype: Annotated[str | None, typer.Option(help="float32, bfloat16 or float16.")] = None,
    max_num_seqs: Annotated[int, typer.Option(help="Requests decoded together.", min=1)] = 64,
    kv_cache_dtype: Annotated[str, typer.Option(help="auto, fp8 or int8 (KV pool).")] = "auto",
    device: Annotated[str | None, typer.Option(help="cpu (default), cuda or cuda:N.")] = None,
    max_pending: Annotated[int, typer.Option(
        help="Requests in flight before new ones get 429.", min=1)] = 256,
    log_level: Annotated[str, typer.Option(help="uvicorn log level.")] = "info",
) -> None:
    """Serve /v1/completions, /v1/chat/completions, cache control and /metrics."""
    import uvicorn

    from prefixcache.engine.async_llm import AsyncLLM
    from prefixcache.integrations.server import build_app

    try:
        engine = AsyncLLM(
            model=model, block_size=block_size, num_blocks=num_blocks,
            kv_cache_memory=kv_cache_memory, max_model_len=max_model_len, dtype=dtype,
            max_num_seqs=max_num_seqs, kv_cache_dtype=kv_cache_dtype, device=device,
        )
    except (OSError, TypeError, ValueError) as error:
        raise typer.BadParameter(str(error)) from None
    try:
        app = build_app(engine, model_name=served_model_name or model, api_key=api_key,
                        max_pending=max_pending)
        uvicorn.run(app, host=host, port=port, log_level=log_level, lifespan="off")
    finally:
        engine.shutdown()


def register(app: typer.Typer) -> None:
    """Add `serve` to the `prefixcache` app."""
    app.command("serve")(serve)
