"""What the router adds to a request: the routing decision on a 32K-token prompt over 8
backends, paced at 200 decisions/s, and the added TTFT of a streamed call through
``prefixcache router`` against the same call made directly.

    python benchmarks/router_overhead.py [--tokens 32768 --backends 8 --rate 200 --pairs 40]

Part A (in this process): 8 precise backends, each holding a different share (0, 1/8, ...,
7/8) of the prompt, fed to ``PrefixIndexes`` as their caches' BlockStored events. A decision
is what the router does before forwarding: the request body parsed (``BodyParser``), its token ids,
the index match (``cached_tokens``) and ``RoutingPolicy.choose``; for a chat request also
the local tokenization of the resent conversation (``PromptTokenizer``, SmolLM2's tokenizer).
Decisions are started on a 200/s clock and timed from their scheduled start.

Part B (real processes): one ``prefixcache serve`` on a small random model that takes a 32K
context (block size 16, KV events on), ``prefixcache router`` in front of it and, beside it, a
bare proxy (``bare_proxy.py``: the router's forwarding with no decision); the prompt is cached
first, then streamed requests (``max_tokens: 1``) go direct / bare / routed in turn, and the
router's added TTFT is the median of the differences, request by request: the same prompt
resent, then prompts with a new last block each call. Routed - bare is the router's own cost
(parse, index, policy); bare - direct the extra hop any proxy in Python adds on these cores.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import msgspec
import numpy as np
from bench_report import write_json

from prefixcache import PrefixCache
from prefixcache.integrations.router.prefix_indexes import PrefixIndexes
from prefixcache.integrations.router.request_body import BodyParser
from prefixcache.integrations.router.request_tokens import token_array
from prefixcache.integrations.router.scoring import CostModel, RoutingPolicy
from prefixcache.integrations.server.server_process import free_port, launch, stop
from prefixcache.kernels.cpu.kernel_choice import cpu_model

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
BLOCK_SIZE = 16


def percentile_ms(values: list[float], q: float) -> float:
    return round(float(np.percentile(values, q)) * 1e3, 4)


# ---------------------------------------------------------------------- part A: decisions
def build_indexes(prompt: np.ndarray, num_backends: int) -> PrefixIndexes:
    """Backend b holds the prompt's first b/n, then its own continuation: as many blocks each."""
    indexes = PrefixIndexes()
    rng = np.random.default_rng(1)
    num_blocks = len(prompt) // BLOCK_SIZE
    for backend in range(num_backends):
        shared = len(prompt) * backend // num_backends
        held = prompt.copy()
        held[shared:] = rng.integers(0, 49152, len(prompt) - shared)
        cache = PrefixCache(num_blocks, BLOCK_SIZE)
        cache.set_event_listener(lambda event, b=backend: indexes.apply(b, event))
        blocks = cache.allocate(num_blocks)
        cache.insert(held, blocks)
        cache.release(blocks)
    return indexes


def decision_costs(tokens: int, num_backends: int, rate: float, seconds: float) -> dict[str, Any]:
    """Decisions on the same prompt resent (an agent's history: its block hashes come from
    the router's ``PromptHashMemo``) and on prompts with a new last block each time (the
    whole prompt hashed again), unpaced; then fresh ones paced at ``rate``."""
    rng = np.random.default_rng(0)
    prompt = rng.integers(0, 49152, tokens).astype(np.int32)
    indexes = build_indexes(prompt, num_backends)
    policy = RoutingPolicy("cache_aware", CostModel(1 / 2000))
    backlog = np.zeros(num_backends)
    parser = BodyParser()

    def body(tail: np.ndarray) -> bytes:
        ids = np.concatenate([prompt[: len(prompt) - len(tail)], tail])
        return msgspec.json.encode({"model": "m", "prompt": ids.tolist(), "max_tokens": 1})

    resent = body(prompt[-BLOCK_SIZE:])
    fresh = [body(rng.integers(0, 49152, BLOCK_SIZE)) for _ in range(int(seconds * rate) + 200)]

    def decide(raw: bytes) -> int:  # what the router does before forwarding, as it does it
        ids = token_array(parser.parse(raw)["prompt"])
        cached = indexes.cached_tokens(ids, num_backends)
        return policy.choose(len(ids), cached, backlog, 7)

    assert decide(resent) == num_backends - 1, "the backend holding the most must win"

    def unpaced(bodies: list[bytes]) -> list[float]:
        took = []
        for raw in bodies:
            started = time.perf_counter()
            decide(raw)
            took.append(time.perf_counter() - started)
        return took

    resent_s, fresh_s = unpaced([resent] * 200), unpaced(fresh[:200])
    period = 1.0 / rate
    latencies, busy = [], 0.0
    start = time.perf_counter()
    for k in range(int(seconds * rate)):
        scheduled = start + k * period
        while (now := time.perf_counter()) < scheduled:
            time.sleep(min(scheduled - now, 0.001))
        began = time.perf_counter()
        decide(fresh[200 + k])
        done = time.perf_counter()
        busy += done - began
        latencies.append(done - scheduled)
    elapsed = time.perf_counter() - start
    return {
        "prompt_tokens": tokens, "backends": num_backends,
        "decision_p50_ms": percentile_ms(resent_s, 50),
        "decision_p99_ms": percentile_ms(resent_s, 99),
        "decision_new_tail_p50_ms": percentile_ms(fresh_s, 50),
        "decision_new_tail_p99_ms": percentile_ms(fresh_s, 99),
        "paced_rate_per_s": rate,
        "paced_latency_p50_ms": percentile_ms(latencies, 50),
        "paced_latency_p99_ms": percentile_ms(latencies, 99),
        "paced_cpu_share": round(busy / elapsed, 3),
    }


def chat_tokenization_cost(tokens: int) -> dict[str, Any] | None:
    """A resent agent conversation of ~``tokens`` tokens through the local tokenizer."""
    try:
        from prefixcache.integrations.router.prompt_tokenizer import PromptTokenizer

        tokenizer = PromptTokenizer.load("smollm2")
    except Exception as error:  # the model package is optional here
        print(f"chat tokenization skipped: {error}")
        return None
    words = np.random.default_rng(2).choice(["cache", "prefix", "agent", "tool", "result",
                                             "block", "radix", "token", "the", "of"], 400_000)
    text = " ".join(words.tolist())
    messages = [{"role": "system", "content": text[:4000]}]
    turn = 0
    while len(tokenizer.chat_ids(messages, None)) < tokens:
        chunk = text[turn * 3000:(turn + 1) * 3000]
        messages.append({"role": "user" if turn % 2 else "assistant", "content": chunk})
        turn += 1
    started = time.perf_counter()
    tokenizer.chat_ids([*messages[:-1], {"role": "user", "content": "new question"}], None)
    first = time.perf_counter() - started
    resent = []
    for _ in range(50):
        started = time.perf_counter()
        ids = tokenizer.chat_ids(messages, None)
        resent.append(time.perf_counter() - started)
    return {"chat_tokens": len(ids), "messages": len(messages),
            "resent_p50_ms": percentile_ms(resent, 50), "with_new_turn_ms": round(first * 1e3, 3)}


# ---------------------------------------------------------------------- part B: proxy hop
def streamed_ttft(client: httpx.Client, url: str, body: bytes) -> tuple[float, str]:
    started = time.perf_counter()
    headers = {"content-type": "application/json"}
    with client.stream("POST", f"{url}/v1/completions", content=body, headers=headers) as reply:
        if reply.status_code != 200:
            raise RuntimeError(f"{url}: {reply.status_code} {reply.read().decode()[:500]}")
        for line in reply.iter_lines():
            if line.startswith("data: {"):
                return time.perf_counter() - started, reply.headers.get("x-prefixcache-backend", "")
    raise RuntimeError("no chunk streamed")


def router_decisions(client: httpx.Client, url: str) -> tuple[float, float]:
    """The router's own decision histogram so far: (seconds summed, decisions)."""
    sums = {}
    for line in client.get(f"{url}/metrics").text.splitlines():
        if line.startswith("prefixcache_router_decision_seconds_"):
            name, value = line.split()
            sums[name.rsplit("_", 1)[1]] = float(value)
    return sums["sum"], sums["count"]


def proxy_overhead(tokens: int, pairs: int) -> dict[str, Any]:
    """Streamed TTFT of the same request direct, through a bare proxy (``bare_proxy.py``: the
    router's forwarding, no decision) and through the router, one after the other, ``pairs``
    times: first the same prompt resent, then prompts with a new last block each call. A
    warm-up round of each kind runs first, untimed, so the router's memos are full as under
    steady traffic."""
    from tiny_model_factory import make_tiny_model_dir

    environment = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    with tempfile.TemporaryDirectory() as folder:
        model = make_tiny_model_dir(Path(folder), "llama", max_position_embeddings=tokens + 64)
        ports = free_port(), free_port(), free_port()
        serve_url, router_url, bare_url = (f"http://127.0.0.1:{port}" for port in ports)
        blocks = tokens // BLOCK_SIZE + 8 * pairs + 64  # room for every new tail
        server = launch([sys.executable, "-m", "prefixcache.integrations.cli", "serve",
                        "--model", str(model), "--port", str(ports[0]), "--dtype", "float32",
                        "--num-blocks", str(blocks), "--block-size", str(BLOCK_SIZE),
                        "--served-model-name", "tiny", "--log-level", "warning",
                        "--max-model-len", str(tokens + 64),
                        "--kv-events", f"tcp://127.0.0.1:{free_port()}"], serve_url, environment)
        proxies = []
        try:
            proxies.append(launch([sys.executable, "-m", "prefixcache.integrations.cli",
                                   "router", "--port", str(ports[1]), "--backend", serve_url,
                                   "--log-level", "warning"], router_url, environment))
            proxies.append(launch([sys.executable, str(Path(__file__).parent / "bare_proxy.py"),
                                   str(ports[2]), serve_url], bare_url, environment))
            rng = np.random.default_rng(3)
            prompt = rng.integers(1, 384, tokens).tolist()

            def request(ids: list[int]) -> bytes:
                return json.dumps({"model": "tiny", "prompt": ids, "max_tokens": 1,
                                   "stream": True}).encode()  # fmt: skip

            def new_tail() -> bytes:
                return request(prompt[:-BLOCK_SIZE] + rng.integers(1, 384, BLOCK_SIZE).tolist())

            body = request(prompt)
            paths = {"direct": serve_url, "bare": bare_url, "routed": router_url}
            resent: dict[str, list[float]] = {name: [] for name in paths}
            fresh: dict[str, list[float]] = {name: [] for name in paths}
            with httpx.Client(timeout=600) as client:
                cold, _ = streamed_ttft(client, router_url, body)
                time.sleep(0.5)  # the stored blocks' events reach the router's index
                for _ in range(pairs):  # warm-up
                    for url in paths.values():
                        streamed_ttft(client, url, body)
                        streamed_ttft(client, url, new_tail())
                decided = [router_decisions(client, router_url)]
                for _ in range(pairs):
                    for name, url in paths.items():
                        ttft, backend = streamed_ttft(client, url, body)
                        resent[name].append(ttft)
                        assert name != "routed" or backend == serve_url, backend
                decided.append(router_decisions(client, router_url))
                for _ in range(pairs):  # a new last block each call, on every path
                    for name, url in paths.items():
                        fresh[name].append(streamed_ttft(client, url, new_tail())[0])
                decided.append(router_decisions(client, router_url))
                stats = client.get(f"{router_url}/router/stats").json()
        finally:
            for process in proxies:
                stop(process)
            stop(server)

    def gap(times: dict[str, list[float]], later: str, earlier: str) -> list[float]:
        return [a - b for a, b in zip(times[later], times[earlier], strict=True)]

    def decision_ms(phase: int) -> float:
        (sum_a, count_a), (sum_b, count_b) = decided[phase], decided[phase + 1]
        return round((sum_b - sum_a) / (count_b - count_a) * 1e3, 4)

    result: dict[str, Any] = {"prompt_tokens": tokens, "pairs": pairs,
                              "request_bytes": len(body), "cold_ttft_s": round(cold, 3)}
    for prefix, times, phase in (("", resent, 0), ("new_tail_", fresh, 1)):
        added, bare = gap(times, "routed", "direct"), gap(times, "bare", "direct")
        result |= {
            f"direct_{prefix}ttft_p50_ms": percentile_ms(times["direct"], 50),
            f"routed_{prefix}ttft_p50_ms": percentile_ms(times["routed"], 50),
            f"added_ttft_{prefix}p50_ms": percentile_ms(added, 50),
            f"added_ttft_{prefix}p90_ms": percentile_ms(added, 90),
            f"bare_proxy_added_ttft_{prefix}p50_ms": percentile_ms(bare, 50),
            f"router_over_bare_{prefix}p50_ms": percentile_ms(gap(times, "routed", "bare"), 50),
            f"decision_in_router_{prefix}mean_ms": decision_ms(phase),
        }
    result["router_indexed_blocks"] = stats["backends"][0]["indexed_blocks"]
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, default=32768)
    parser.add_argument("--backends", type=int, default=8)
    parser.add_argument("--rate", type=float, default=200.0)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--pairs", type=int, default=40)
    parser.add_argument("--skip-proxy", action="store_true")
    parser.add_argument("--json", default="router_overhead.json")
    args = parser.parse_args()

    result: dict[str, Any] = {"cpu": cpu_model()}
    result["decision"] = decision_costs(args.tokens, args.backends, args.rate, args.seconds)
    print("decision:", json.dumps(result["decision"]))
    result["chat_tokenization"] = chat_tokenization_cost(args.tokens)
    print("chat tokenization:", json.dumps(result["chat_tokenization"]))
    if not args.skip_proxy:
        result["proxy"] = proxy_overhead(args.tokens, args.pairs)
        print("proxy:", json.dumps(result["proxy"]))
    write_json(args.json, result)


if __name__ == "__main__":
    main()
