"""How long one request can hold the server's event loop: /health latency while it is read.

A thread polls ``/health`` on its own connection while each request below is sent, one at a
time, to a live server (``BackgroundServer``) on the default model; for each request the
script prints its status, its own time, and the slowest and median /health answer that
overlapped it. Two servers side by side: one with the default request limits, one with caps
as wide as the server's first release had (a 60.75 MiB body, no prompt or token cap), sent
its largest bodies, to show what the limits buy. Requests: the largest each default cap lets
through (256 text prompts filling the token cap; the token cap as ids; a body of ids at the
byte cap; a body of one-word chat messages at the byte cap) and two bodies from the field
(748,982 two-letter prompts; a temperature of 5e-324).

    python benchmarks/loop_stall.py [--quick] [--out results/loop_stall.json]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import httpx
from bench_report import write_json
from health_probe import HealthProbe

from prefixcache.kernels.cpu.kernel_choice import cpu_model

WIDE = {"max_body_bytes": 63_700_992, "max_prompts": 1 << 30, "max_prompt_tokens": 1 << 40}
JSON_HEADERS = {"content-type": "application/json"}
WIDE_REQUESTS = ("ids filling the body cap",)  # 2 M chat messages would take GBs to hold


def requests(limits, tokenizer, quick: bool) -> list[tuple[str, str, Callable[[], bytes]]]:
    """(name, route, a function making the raw body) of the requests to time."""
    scale = 8 if quick else 1
    per_prompt = limits.max_prompt_tokens // limits.max_prompts // scale
    unit = " hello"
    body_bytes = limits.max_body_bytes // scale
    message = '{"role":"user","content":"m"}'

    def completion(**fields) -> bytes:
        return json.dumps({"model": "smollm2", "max_tokens": 1, **fields}).encode()

    def texts() -> bytes:
        text = unit * (per_prompt // len(tokenizer.encode(unit)))
        return completion(prompt=[text] * limits.max_prompts)

    def ids() -> bytes:
        many = ",".join(["7"] * ((body_bytes - 64) // 2))
        return f'{{"max_tokens":1,"prompt":[{many}]}}'.encode()

    def messages() -> bytes:
        many = ",".join([message] * ((body_bytes - 64) // (len(message) + 1)))
        return f'{{"max_tokens":1,"messages":[{many}]}}'.encode()

    return [
        ("256 text prompts at the token cap", "/v1/completions", texts),
        ("256 id prompts at the token cap", "/v1/completions",
         lambda: completion(prompt=[[7] * per_prompt] * limits.max_prompts)),
        ("ids filling the body cap", "/v1/completions", ids),
        ("chat messages filling the body cap", "/v1/chat/completions", messages),
        ("748,982 two-letter prompts", "/v1/completions",
         lambda: completion(prompt=["ab"] * (748_982 // scale))),
        ("temperature 5e-324", "/v1/completions",
         lambda: completion(prompt="Hello", max_tokens=4, temperature=5e-324)),
    ]


def run_server(engine, name: str, caps: dict, quick: bool, only: tuple[str, ...] = ()
               ) -> list[dict]:
    """Time the requests (``only`` those named, if given) against a server with ``caps``."""
    from prefixcache.integrations.cli_serve import freeze_startup_heap
    from prefixcache.integrations.server import BackgroundServer, build_app

    app = build_app(engine, model_name="smollm2", **caps)
    freeze_startup_heap()  # as `prefixcache serve` does
    limits = app.state.server.limits
    rows = []
    with BackgroundServer(app) as server, HealthProbe(server.base_url) as probe:
        for label, route, make_body in requests(limits, engine.llm.tokenizer, quick):
            if only and label not in only:
                continue
            body = make_body()
            start = time.perf_counter()
            response = httpx.post(f"{server.base_url}{route}", content=body, timeout=600,
                                  headers=JSON_HEADERS)
            end = time.perf_counter()
            health = probe.during(start, end)
            error = response.json().get("error") if response.status_code != 200 else None
            rows.append({
                "server": name, "request": label, "body_bytes": len(body),
                "status": response.status_code, "code": error and error["code"],
                "seconds": end - start, "health_max_s": max(health),
                "health_median_s": statistics.median(health), "health_samples": len(health),
            })
            print(f"{name:8s} {label:36s} {len(body) / 2**20:7.2f} MiB  "
                  f"{response.status_code} {(error or {}).get('code') or '':24s} "
                  f"{end - start:7.3f} s  /health max {max(health):7.3f} s "
                  f"median {statistics.median(health):6.3f} s", flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="bodies an eighth the size")
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--out", type=Path, default=Path("results/loop_stall.json"))
    args = parser.parse_args()
    import torch

    from prefixcache.engine.async_llm import AsyncLLM

    engine = AsyncLLM(model=args.model)
    try:
        rows = run_server(engine, "default", {}, args.quick)
        # the wide caps' largest bodies only: their prompts would keep the engine busy for
        # minutes (the field's 748,982 prompts are each a request)
        rows += run_server(engine, "wide", WIDE, args.quick, only=WIDE_REQUESTS)
    finally:
        engine.shutdown()
    write_json(args.out, {
        "quick": args.quick, "model": args.model, "cpu": platform.processor() or cpu_model(),
        "torch": torch.__version__, "rows": rows,
    })


if __name__ == "__main__":
    main()
