"""`prefixcache router`: a cache-aware OpenAI-compatible router in front of N backends (ours,
vLLM or any OpenAI server). Bad options exit with code 2 and one message."""

from __future__ import annotations

from typing import Annotated

import typer

EVENTS_HELP = ("KV events of a backend that does not advertise them (vLLM with "
               "--kv-events-config): URL=tcp://host:5557[,tcp://host:5558 replay] (repeatable).")


def parse_backend_events(values: list[str]) -> dict[str, object]:
    """``URL=ENDPOINT[,REPLAY]`` strings as {url: EventSource}; ValueError naming a bad one."""
    from prefixcache.engine.kv_event_publisher import check_endpoint
    from prefixcache.integrations.router.backend_pool import EventSource

    sources: dict[str, object] = {}
    for value in values:
        url, sep, endpoints = value.partition("=")
        if not sep or not url or not endpoints:
            raise ValueError(f"--backend-events takes URL=tcp://host:port, got {value!r}")
        endpoint, _, replay = endpoints.partition(",")
        check_endpoint("--backend-events", endpoint)
        if replay:
            check_endpoint("--backend-events replay", replay)
        sources[url.rstrip("/")] = EventSource(endpoint, replay or None)
    return sources


def router(
    backend: Annotated[list[str], typer.Option(help="Backend base URL (repeatable).")],
    host: Annotated[str, typer.Option(help="Interface to bind.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="TCP port.", min=1, max=65535)] = 8080,
    policy: Annotated[str, typer.Option(
        help="cache_aware, round_robin, least_load, random or session_hash.")] = "cache_aware",
    tokenizer: Annotated[str | None, typer.Option(
        help="Tokenize locally with this model's tokenizer and chat template ('smollm2', a "
             "Hugging Face folder or a .gguf); default: ask a backend's /tokenize.",
        show_default=False)] = None,
    backend_events: Annotated[list[str] | None, typer.Option(help=EVENTS_HELP)] = None,
    prefill_tokens_per_s: Annotated[float, typer.Option(
        help="The backends' prefill speed: what a cached token saves.", min=1e-9)] = 2000.0,
    health_interval: Annotated[float, typer.Option(
        help="Seconds between health checks (a dead backend is out within twice that).",
        min=0.05)] = 0.5,
    approx_blocks: Annotated[int, typer.Option(
        help="Blocks a backend without events is assumed to cache.", min=1)] = 65536,
    log_level: Annotated[str, typer.Option(help="uvicorn log level.")] = "info",
) -> None:
    """Route OpenAI requests to the backend that holds their prefix, by estimated TTFT."""
    import logging

    import uvicorn

    from prefixcache.integrations.router.app import RouterConfig, build_router_app
    from prefixcache.integrations.router.prompt_tokenizer import PromptTokenizer
    from prefixcache.integrations.router.scoring import ROUTING_POLICIES

    try:
        if policy not in ROUTING_POLICIES:
            raise ValueError(f"unknown --policy {policy!r}; choose from "
                             f"{', '.join(ROUTING_POLICIES)}")  # fmt: skip
        events = parse_backend_events(backend_events or [])
        config = RouterConfig(
            backends=backend, policy=policy, events=events,  # type: ignore[arg-type]
            tokenizer=PromptTokenizer.load(tokenizer) if tokenizer else None,
            prefill_tokens_per_s=prefill_tokens_per_s, health_interval_s=health_interval,
            approx_blocks=approx_blocks,
        )
        app = build_router_app(config)
    except (TypeError, ValueError) as error:
        raise typer.BadParameter(str(error)) from None
    logging.getLogger("prefixcache").setLevel(log_level.upper())
    logging.getLogger("prefixcache").addHandler(logging.StreamHandler())
    uvicorn.run(app, host=host, port=port, log_level=log_level)


def register(app: typer.Typer) -> None:
    app.command("router")(router)
