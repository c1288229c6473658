"""Which GEMM runs each projection of a model, per row-count bucket, chosen by measurement on
this machine: the compiled GEMM or oneDNN (see ``gemm_candidates``).

At a model's first load on a machine, ``choose_gemms`` times both implementations on the
model's own projection shapes (``ProjectionShape``) at each bucket's row count (``ROW_BUCKETS``;
a step of ``rows`` rows uses the largest bucket not above it), the two interleaved, medians of
a few rounds: milliseconds in all. Weights of a bucket of at most ``STREAMED_ROWS`` rows are
cycled through distinct copies bigger than the caches, as a decode step streams them; larger
buckets are compute-bound and run on one hot copy. oneDNN is chosen for a (projection,
bucket) only when it is faster by ``MARGIN`` (a shared machine's noise never makes the choice
slower than the compiled GEMM), and for a decoder layer's four projections only when the
layer as a whole gains that much (a layer not all on the compiled GEMM runs op by op, not as
one fused call). The result is cached as JSON beside the compiled kernels
(``cache_dir()/choices``), keyed by the CPU model and flags, torch version, thread count,
dtype and shapes, and one line is logged saying what was chosen.

``PREFIXCACHE_KERNEL_CHOICE`` overrides the measurement: ``measured`` (default), ``compiled``
(the compiled GEMM everywhere: a token's result is then bitwise independent of how its prompt
was chunked or cached), ``onednn`` (oneDNN everywhere it runs), ``onednn>=N`` (oneDNN from
buckets of N rows up, the compiled GEMM below).

A choice that mixes implementations across buckets gives a token computed in a 64-row step
other last bits than in a 1,024-row step: cached and uncached answers then agree in greedy
tokens (tested) but not always bit for bit. Where the measurement keeps the compiled GEMM
everywhere (AMD Zen 3 / Zen 4 so far) nothing changes.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
import platform
import statistics
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch

from prefixcache.kernels.cpu.build import cache_dir, cpu_flags
from prefixcache.kernels.cpu.gemm_candidates import COMPILED, ONEDNN, gemm_candidates

log = logging.getLogger(__name__)

ROW_BUCKETS = (1, 4, 16, 64, 256, 1024)  # rows timed per bucket; a step uses the largest <=
STREAMED_ROWS = 16  # buckets up to this stream their weights from memory (decode-like)
STREAMED_BYTES = 48 << 20  # distinct weight copies per timing pass in the streamed buckets
MAX_COPIES = 64  # (at most this many: a tiny weight's calls are dominated by their overhead)
MARGIN = 0.10  # oneDNN must be this much faster (share of the compiled GEMM's time)
ROUNDS = 5
LAYER_OPS = ("qkv", "o", "gate_up", "down")  # a decoder layer's projections
CHOICE_ENV = "PREFIXCACHE_KERNEL_CHOICE"
_SCHEMA = 1


def bucket_of(rows: int) -> int:
    """The bucket a call of ``rows`` rows uses: the largest of ``ROW_BUCKETS`` not above it."""
    chosen = ROW_BUCKETS[0]
    for bucket in ROW_BUCKETS:
        if bucket <= rows:
            chosen = bucket
    return chosen


@dataclass(frozen=True)
class ProjectionShape:
    """One kind of projection of a model: its name (``qkv``, ``o``, ``gate_up``, ``down``,
    ``head``), weight shape ``[out_features, in_features]``, and the buckets it meets (the
    output head only sees the sampled rows)."""

    name: str
    out_features: int
    in_features: int
    buckets: tuple[int, ...] = ROW_BUCKETS


@dataclass(frozen=True)
class Policy:
    """What ``PREFIXCACHE_KERNEL_CHOICE`` asks for: ``mode`` ``measured``, ``compiled`` or
    ``onednn``; with ``onednn``, the buckets from ``onednn_from_rows`` up use oneDNN."""

    mode: str
    onednn_from_rows: int = 1

    @classmethod
    def parse(cls, text: str) -> Policy:
        """``measured`` | ``compiled`` | ``onednn`` | ``onednn>=N``; ValueError otherwise."""
        value = text.strip().lower()
        if value in ("measured", COMPILED, ONEDNN):
            return cls(value)
        if value.startswith(ONEDNN + ">="):
            rows = value.removeprefix(ONEDNN + ">=")
            if rows.isdigit() and int(rows) >= 1:
                return cls(ONEDNN, int(rows))
        raise ValueError(
            f"{CHOICE_ENV}={text!r}: choose measured, compiled, onednn or onednn>=ROWS"
        )


def current_policy() -> Policy:
    """The policy ``PREFIXCACHE_KERNEL_CHOICE`` sets (``measured`` when unset)."""
    return Policy.parse(os.environ.get(CHOICE_ENV, "measured"))


@dataclass
class GemmChoice:
    """Per projection name, per bucket: the implementation that runs, and (when measured) the
    seconds per call of each candidate. ``source`` says where it came from: ``measured``,
    ``cache`` or ``env``."""

    chosen: dict[str, dict[int, str]]
    seconds: dict[str, dict[int, dict[str, float]]] = field(default_factory=dict)
    source: str = "measured"
    key: dict[str, object] = field(default_factory=dict)

    def implementation(self, name: str, rows: int) -> str:
        """The implementation projection ``name`` runs for a call of ``rows`` rows."""
        return self.chosen.get(name, {}).get(bucket_of(rows), COMPILED)

    def onednn_buckets(self, name: str) -> frozenset[int]:
        """The buckets where projection ``name`` runs oneDNN."""
        return frozenset(b for b, impl in self.chosen.get(name, {}).items() if impl == ONEDNN)

    def layers_fused(self, rows: int) -> bool:
        """Whether a step of ``rows`` rows runs the decoder layers as fused compiled calls
        (every layer projection on the compiled GEMM in that bucket)."""
        return all(self.implementation(name, rows) == COMPILED for name in LAYER_OPS)

    def summary(self) -> str:
        """One line: what runs oneDNN, or that the compiled GEMM runs everything."""
        parts = []
        for name, buckets in self.chosen.items():
            on = sorted(b for b, impl in buckets.items() if impl == ONEDNN)
            if on:
                parts.append(f"{name} at {','.join(map(str, on))} rows")
        if not parts:
            return "the compiled GEMM for every projection and row count"
        return "oneDNN for " + "; ".join(parts) + ", the compiled GEMM elsewhere"

    def to_json(self) -> dict[str, object]:
        return {
            "schema": _SCHEMA, "key": self.key, "chosen": self.chosen, "seconds": self.seconds,
        }  # fmt: skip

    @classmethod
    def from_json(cls, data: Mapping[str, object], source: str) -> GemmChoice:
        def by_bucket(table: object) -> dict[str, dict[int, object]]:
            return {op: {int(b): v for b, v in rows.items()} for op, rows in table.items()}

        return cls(
            chosen=by_bucket(data["chosen"]),  # type: ignore[arg-type]
            seconds=by_bucket(data.get("seconds", {})),  # type: ignore[arg-type]
            source=source, key=dict(data.get("key", {})),  # type: ignore[arg-type]
        )


def decide(
    seconds: Mapping[str, Mapping[int, Mapping[str, float]]], margin: float = MARGIN
) -> dict[str, dict[int, str]]:
    """The choice from measured seconds per call (projection -> bucket -> implementation ->
    seconds): oneDNN where it beats the compiled GEMM by ``margin``; then, per bucket, the
    layer projections go back to the compiled GEMM unless the layer's summed time drops by
    ``margin`` (running op by op is only worth a real gain). Pure: the tests feed it numbers."""
    chosen: dict[str, dict[int, str]] = {}
    for name, buckets in seconds.items():
        chosen[name] = {}
        for bucket, times in buckets.items():
            ours, theirs = times.get(COMPILED), times.get(ONEDNN)
            library = theirs is not None and (ours is None or theirs <= ours * (1 - margin))
            chosen[name][bucket] = ONEDNN if library else COMPILED
    layer = [name for name in LAYER_OPS if name in seconds]
    for bucket in {b for name in layer for b in seconds[name]}:
        timed = [seconds[name][bucket] for name in layer if bucket in seconds[name]]
        if any(COMPILED not in times for times in timed):
            continue  # no compiled GEMM to stay on
        before = sum(times[COMPILED] for times in timed)
        after = sum(
            seconds[name][bucket][chosen[name][bucket]] for name in layer
            if bucket in seconds[name]
        )  # fmt: skip
        if after > before * (1 - margin):
            for name in layer:
                if bucket in chosen[name]:
                    chosen[name][bucket] = COMPILED
    return chosen


def forced_choice(shapes: Sequence[ProjectionShape], policy: Policy) -> GemmChoice:
    """The choice ``policy`` (``compiled`` or ``onednn``) imposes, without measuring."""
    def implementation(bucket: int) -> str:
        if policy.mode == ONEDNN and bucket >= policy.onednn_from_rows:
            return ONEDNN
        return COMPILED

    chosen = {s.name: {b: implementation(b) for b in s.buckets} for s in shapes}
    return GemmChoice(chosen, source="env")


def _median_seconds(calls: Mapping[str, Callable[[], object]], rounds: int) -> dict[str, float]:
    """Seconds per call of each function: one warm-up each, then ``rounds`` rounds in which
    every function runs once, the order rotating; the median per function."""
    for call in calls.values():
        call()
    names = list(calls)
    times: dict[str, list[float]] = {name: [] for name in names}
    for round_index in range(rounds):
        shift = round_index % len(names)
        for name in names[shift:] + names[:shift]:
            start = time.perf_counter()
            calls[name]()
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(values) for name, values in times.items()}


def _run_all(run: Callable[..., torch.Tensor], x: torch.Tensor, weights: list[torch.Tensor],
             out_features: int) -> None:
    for packed in weights:
        run(x, packed, out_features, None)


def measure_projection(
    shape: ProjectionShape, dtype: torch.dtype, rounds: int = ROUNDS
) -> dict[int, dict[str, float]]:
    """Seconds per call of every candidate GEMM on ``shape`` at each of its buckets (random
    weights of the real shape; timing does not depend on their values)."""
    generator = torch.Generator().manual_seed(0)
    weight = torch.randn(shape.out_features, shape.in_features, generator=generator)
    weight = weight.to(dtype)
    candidates = gemm_candidates(weight)
    if not candidates:
        return {}
    weight_bytes = weight.numel() * weight.element_size()
    copies = min(MAX_COPIES, max(1, -(-STREAMED_BYTES // weight_bytes)))
    streamed = {
        name: [c.pack(weight) for _ in range(copies)] for name, c in candidates.items()
    }
    hot = {name: packs[:1] for name, packs in streamed.items()}
    seconds: dict[int, dict[str, float]] = {}
    for bucket in shape.buckets:
        x = torch.randn(bucket, shape.in_features, generator=generator).to(dtype)
        packs = streamed if bucket <= STREAMED_ROWS else hot
        calls = {
            name: functools.partial(_run_all, candidates[name].run, x, packs[name],
                                    shape.out_features)
            for name in candidates
        }  # fmt: skip
        passes = _median_seconds(calls, rounds)
        seconds[bucket] = {n: passes[n] / len(packs[n]) for n in candidates}
    return seconds


def choice_key(shapes: Sequence[ProjectionShape], dtype: torch.dtype) -> dict[str, object]:
    """What a measured choice depends on: the machine, torch, threads, dtype and shapes."""
    return {
        "schema": _SCHEMA, "cpu": _cpu_model(), "flags": sorted(cpu_flags()),
        "machine": platform.machine(), "torch": torch.__version__,
        "threads": torch.get_num_threads(), "dtype": str(dtype).removeprefix("torch."),
        "shapes": [[s.name, s.out_features, s.in_features, list(s.buckets)] for s in shapes],
        "margin": MARGIN,
    }  # fmt: skip


def choice_path(key: Mapping[str, object]) -> Path:
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:24]
    return cache_dir() / "choices" / f"gemm-{digest}.json"


def choose_gemms(
    shapes: Sequence[ProjectionShape], dtype: torch.dtype, remeasure: bool = False
) -> GemmChoice:
    """The GEMM choice for a model of these projection shapes in ``dtype`` on this machine:
    the environment's forced policy, else the cached measurement, else a new measurement
    (cached, unless the cache directory cannot be written). Logs one line."""
    policy = current_policy()
    if policy.mode != "measured":
        choice = forced_choice(shapes, policy)
        log.info("GEMM choice (%s=%s): %s", CHOICE_ENV, policy.mode, choice.summary())
        return choice
    key = choice_key(shapes, dtype)
    path = choice_path(key)
    if not remeasure:
        try:
            data = json.loads(path.read_text())
            if data.get("key") == key:
                choice = GemmChoice.from_json(data, "cache")
                log.info("GEMM choice (cached, %s): %s", path, choice.summary())
                return choice
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            pass  # absent or unreadable: measure again
    start = time.perf_counter()
    seconds = {s.name: measure_projection(s, dtype) for s in shapes}
    choice = GemmChoice(decide(seconds), seconds, "measured", key)
    _write_atomically(path, json.dumps(choice.to_json(), indent=1))
    log.info(
        "GEMM choice (measured in %.2f s on %s): %s",
        time.perf_counter() - start, key["cpu"], choice.summary(),
    )
    return choice


def _write_atomically(path: Path, text: str) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile("w", dir=path.parent, delete=False) as tmp:
            tmp.write(text)
        os.replace(tmp.name, path)
    except OSError as exc:  # a read-only cache only costs a new measurement next time
        log.debug("GEMM choice not cached at %s: %s", path, exc)


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"
