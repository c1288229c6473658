"""`prefixcache serve`: the OpenAI-compatible server on a model, with uvicorn.

    prefixcache serve --model smollm2 --host 127.0.0.1 --port 8000 [--api-key KEY]
                      [--max-body-bytes N] [--max-prompts-per-request N]
                      [--max-prompt-tokens-per-request N] [--shutdown-timeout S]

SIGTERM drains: the requests in flight get ``--shutdown-timeout`` seconds to finish, then are
aborted (``integrations/server/graceful_shutdown.py``); a second SIGTERM exits at once.

The key can also come from the PREFIXCACHE_API_KEY environment variable (kept out of the
process list). Bad options exit with code 2 and one message; those that can be checked
without the model (--log-level, --kv-cache-dtype, whether --host/--port can be bound, --device)
are checked before it loads, and any failure to load the model is one message too.
"""

from __future__ import annotations

import gc
import logging
import socket
from enum import Enum
from typing import Annotated

import typer


class LogLevel(str, Enum):
    """uvicorn's log levels (the keys of ``uvicorn.config.LOG_LEVELS``)."""

    critical = "critical"
    error = "error"
    warning = "warning"
    info = "info"
    debug = "debug"
    trace = "trace"


def check_bind(host: str, port: int) -> None:
    """ValueError unless ``host`` resolves and every address it resolves to can be bound on
    ``port`` now, as uvicorn will (asyncio's create_server: SO_REUSEADDR, IPv6 sockets
    IPv6-only). Cheap, and it runs before the model loads; the port is released again."""
    try:
        addresses = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )
    except (socket.gaierror, UnicodeError) as error:
        raise ValueError(f"--host {host!r} does not resolve: {error}") from None
    for family, kind, proto, _, address in addresses:
        try:
            with socket.socket(family, kind, proto) as probe:
                probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                if family == socket.AF_INET6:
                    probe.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
                probe.bind(address)
        except OSError as error:
            where = host if address[0] == host else f"{host} ({address[0]})"
            reason = error.strerror or str(error)
            raise ValueError(f"cannot listen on {where} port {port}: {reason}") from None


def check_kv_cache_dtype(kv_cache_dtype: str) -> None:
    """ValueError unless the engine knows ``kv_cache_dtype`` (checked before the model
    loads; the engine itself only sees it once the weights are in memory)."""
    from prefixcache.kernels import KV_CACHE_DTYPES

    if kv_cache_dtype not in KV_CACHE_DTYPES:
        raise ValueError(
            f"unknown --kv-cache-dtype {kv_cache_dtype!r}; choose from {list(KV_CACHE_DTYPES)}"
        )


def check_kv_tier_dtype(kv_tier_dtype: str, kv_cache_dtype: str) -> None:
    """ValueError unless ``kv_tier_dtype`` suits a pool of ``kv_cache_dtype`` (before the
    model loads)."""
    import torch

    from prefixcache.engine.kv_tier_codec import tier_storage_dtype
    from prefixcache.kernels import kv_storage_dtype

    try:
        tier_storage_dtype(kv_tier_dtype, kv_storage_dtype(kv_cache_dtype, torch.float32))
    except ValueError as error:
        raise ValueError(f"--kv-tier-dtype: {error}") from None


def check_kv_events(endpoint: str | None, replay: str | None) -> None:
    from prefixcache.engine import kv_event_publisher

    kv_event_publisher.check_kv_events(endpoint, replay, ("--kv-events", "--kv-events-replay"))


def check_tool_call_parser(name: str) -> None:
    from prefixcache.engine.tool_calls import TOOL_CALL_PARSERS

    if name != "auto" and name not in TOOL_CALL_PARSERS:
        raise ValueError(f"unknown --tool-call-parser {name!r}; choose from auto, "
                         f"{', '.join(TOOL_CALL_PARSERS)}")  # fmt: skip


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
    kv_host_memory: Annotated[str | None, typer.Option(
        help="Host-memory KV tier under the pool (bytes or a size such as 8GiB): evicted "
             "prefixes are kept there and loaded back.", show_default=False)] = None,
    kv_disk_dir: Annotated[str | None, typer.Option(
        help="Persistent disk KV tier: every computed block is written here and found again "
             "after a restart.", show_default=False)] = None,
    kv_disk_size: Annotated[str | None, typer.Option(
        help="Bytes the disk tier may hold (default 10GiB).", show_default=False)] = None,
    kv_remote: Annotated[str | None, typer.Option(
        help="KV tier shared with other replicas in Redis/Valkey (redis://host:port).",
        show_default=False)] = None,
    kv_tier_dtype: Annotated[str, typer.Option(
        help="auto (the pool's dtype, exact), fp8 or int8: the tiers store blocks quantized, "
             "twice as many in the same bytes.")] = "auto",
    hybrid_kv_cache: Annotated[bool | None, typer.Option(
        "--hybrid-kv-cache/--no-hybrid-kv-cache",
        help="Sliding-window layers keep only the windows they need, in a smaller slot pool "
             "(default: on for models with sliding layers, unless a KV tier is asked for).",
        show_default=False)] = None,
    kv_sliding_slots: Annotated[int | None, typer.Option(
        help="Slots (blocks) of the sliding layers' pool (default: --max-num-seqs windows "
             "and a step).", min=1, show_default=False)] = None,
    kv_events: Annotated[str | None, typer.Option(
        help="Publish the pool's cache events over ZeroMQ here (vLLM's KV-event format), for "
             "a cache-aware router: tcp://127.0.0.1:5557.", show_default=False)] = None,
    kv_events_replay: Annotated[str | None, typer.Option(
        help="Replay socket for subscribers that missed events: tcp://127.0.0.1:5558.",
        show_default=False)] = None,
    kv_events_topic: Annotated[str, typer.Option(help="Topic of the KV events.")] = "",
    tool_call_parser: Annotated[str, typer.Option(
        help="The format the model writes tool calls in: auto (what its chat template shows; "
             "hermes for a template without tools), hermes, llama3_json, mistral or "
             "pythonic.")] = "auto",
    max_model_len: Annotated[int | None, typer.Option(help="Context length cap.", min=2)] = None,
    dtype: Annotated[str | None, typer.Option(help="float32, bfloat16 or float16.")] = None,
    max_num_seqs: Annotated[int, typer.Option(help="Requests decoded together.", min=1)] = 64,
    kv_cache_dtype: Annotated[str, typer.Option(help="auto, fp8 or int8 (KV pool).")] = "auto",
    device: Annotated[str | None, typer.Option(help="cpu (default), cuda or cuda:N.")] = None,
    max_pending: Annotated[int, typer.Option(
        help="Requests in flight before new ones get 429.", min=1)] = 256,
    max_body_bytes: Annotated[int | None, typer.Option(
        help="Request bodies over this many bytes get 413 (default: 32 bytes per allowed "
             "prompt token, at least 1 MiB).", min=1, show_default=False)] = None,
    max_prompts_per_request: Annotated[int, typer.Option(
        help="Prompts one /v1/completions request may carry (more: 400).", min=1)] = 256,
    max_prompt_tokens_per_request: Annotated[int | None, typer.Option(
        help="Prompt tokens one request may carry, all prompts together (more: 400; "
             "default: 16 full contexts, at most 131072 unless one is longer).", min=1,
        show_default=False)] = None,
    shutdown_timeout: Annotated[float, typer.Option(
        help="Seconds SIGTERM lets requests in flight finish before aborting them.",
        min=0)] = 10.0,
    log_level: Annotated[LogLevel, typer.Option(
        help="uvicorn log level.", case_sensitive=False)] = LogLevel.info,
) -> None:
    """Serve /v1/completions, /v1/chat/completions, cache control and /metrics."""
    import uvicorn

    from prefixcache.engine.async_llm import AsyncLLM
    from prefixcache.engine.devices import resolve_device
    from prefixcache.engine.engine_options import parse_memory_size
    from prefixcache.integrations.server import build_app
    from prefixcache.integrations.server.graceful_shutdown import DrainingServer

    try:  # what can be checked without the model, before minutes of loading
        check_kv_cache_dtype(kv_cache_dtype)
        check_kv_tier_dtype(kv_tier_dtype, kv_cache_dtype)
        check_tool_call_parser(tool_call_parser)
        check_kv_events(kv_events, kv_events_replay)
        parse_memory_size("--kv-host-memory", kv_host_memory)
        parse_memory_size("--kv-disk-size", kv_disk_size)
        resolve_device(device)
        check_bind(host, port)
    except (TypeError, ValueError) as error:
        raise typer.BadParameter(str(error)) from None
    try:
        engine = AsyncLLM(
            model=model, block_size=block_size, num_blocks=num_blocks,
            kv_cache_memory=kv_cache_memory, max_model_len=max_model_len, dtype=dtype,
            max_num_seqs=max_num_seqs, kv_cache_dtype=kv_cache_dtype, device=device,
            kv_host_memory=kv_host_memory, kv_disk_dir=kv_disk_dir, kv_disk_size=kv_disk_size,
            kv_remote=kv_remote, kv_tier_dtype=kv_tier_dtype, kv_events=kv_events,
            kv_events_replay=kv_events_replay, kv_events_topic=kv_events_topic,
            hybrid_kv_cache=hybrid_kv_cache, kv_sliding_slots=kv_sliding_slots,
        )
    except Exception as error:  # a malformed file may trip the loader in any way
        from prefixcache.engine.model_registry import describe_load_error

        raise typer.BadParameter(describe_load_error(model, error)) from None
    _log_to_stderr(log_level.value)
    try:
        app = build_app(engine, model_name=served_model_name or model, api_key=api_key,
                        max_pending=max_pending, max_body_bytes=max_body_bytes,
                        max_prompts=max_prompts_per_request,
                        max_prompt_tokens=max_prompt_tokens_per_request,
                        tool_call_parser=tool_call_parser)
        freeze_startup_heap()
        config = uvicorn.Config(app, host=host, port=port, log_level=log_level.value,
                                lifespan="off")
        server = DrainingServer(config, app.state.server, shutdown_timeout)
        server.run()
    finally:
        engine.shutdown()
    if server.force_exit:
        raise typer.Exit(1)


def freeze_startup_heap() -> None:
    """Move every object alive after loading (the model's modules, the app, ~220 K objects for
    SmolLM2) out of the garbage collector's reach, as long-running Python servers do: a full
    collection traversed them all, 105-113 ms with every thread stopped (the event loop and the
    engine's steps alike), and now takes under a millisecond. Objects made later are collected
    as before."""
    gc.collect()
    gc.freeze()


def _log_to_stderr(level: str) -> None:
    """The project's own log records (engine failures with their tracebacks, the shutdown's
    drain) on stderr, at uvicorn's level ("trace" is uvicorn's own, below debug)."""
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(levelname)s:     %(name)s: %(message)s"))
    project = logging.getLogger("prefixcache")
    project.addHandler(handler)
    project.setLevel(logging.DEBUG if level == "trace" else level.upper())


def register(app: typer.Typer) -> None:
    """Add `serve` to the `prefixcache` app."""
    app.command("serve")(serve)
