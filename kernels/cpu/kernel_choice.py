"""Which implementation runs each op of a model, per row-count bucket, chosen by measurement on
this machine: for each projection the compiled GEMM or oneDNN (``gemm_candidates``), for prefill
attention the compiled kernel or torch's SDPA in the model's dtype (its CPU flash kernel,
which reaches AMX tiles through oneDNN's brgemm where the CPU has them).

At a model's first load on a machine, ``choose_kernels`` times both implementations of every
op on the model's own shapes (``ProjectionShape``, ``AttentionShape``) at each bucket's row
count (``ROW_BUCKETS``; a step of ``rows`` rows uses the largest bucket not above it), the two
interleaved, medians of a few rounds (``kernel_timing``): about two seconds in all. The library
is chosen for an (op, bucket) only when it is faster by ``MARGIN`` (a shared machine's noise
never makes the choice slower than the compiled kernels), and for a decoder layer's ops only
when the layer as a whole gains that much (a layer not all compiled runs op by op, not as one
fused call). The result is cached as JSON beside the compiled kernels (``cache_dir()/choices``),
keyed by the CPU model and flags, torch version, thread count, dtype and shapes, and one line is
logged saying what was chosen.

``PREFIXCACHE_KERNEL_CHOICE`` overrides the measurement: ``measured`` (default), ``compiled``
(the compiled kernels everywhere: a token's result is then bitwise independent of how its
prompt was chunked or cached), ``library`` (oneDNN and SDPA everywhere they run),
``library>=N`` (the libraries from buckets of N rows up, the compiled kernels below).

A choice that mixes implementations across buckets gives a token computed in a 64-row step
other last bits than in a 1,024-row step: cached and uncached answers then agree in greedy
tokens (tested) but not always bit for bit. Where the measurement keeps the compiled kernels
everywhere (AMD Zen 3 / Zen 4 so far) nothing changes.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import platform
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch

from prefixcache.kernels.cpu.build import cache_dir, cpu_flags
from prefixcache.kernels.cpu.kernel_timing import measure_op
from prefixcache.kernels.cpu.op_shapes import (
    COMPILED,
    PREFILL_BUCKETS,
    ROW_BUCKETS,
    SDPA,
    AttentionShape,
    OpShape,
    ProjectionShape,
    bucket_of,
)

log = logging.getLogger(__name__)

LIBRARY = "library"  # the policy that runs the libraries: oneDNN and SDPA
MARGIN = 0.10  # a library must be this much faster (share of the compiled kernel's time)
LAYER_OPS = ("qkv", "o", "gate_up", "down", "attention")  # a decoder layer's ops
CHOICE_ENV = "PREFIXCACHE_KERNEL_CHOICE"
_SCHEMA = 2
__all__ = [
    "PREFILL_BUCKETS", "ROW_BUCKETS", "SDPA", "AttentionShape", "KernelChoice", "OpShape",
    "Policy", "ProjectionShape", "bucket_of", "choose_kernels", "current_policy", "decide",
]  # fmt: skip




@dataclass(frozen=True)
class Policy:
    """What ``PREFIXCACHE_KERNEL_CHOICE`` asks for: ``mode`` ``measured``, ``compiled`` or
    ``library``; with ``library``, the buckets from ``library_from_rows`` up use the libraries."""

    mode: str
    library_from_rows: int = 1

    @classmethod
    def parse(cls, text: str) -> Policy:
        """``measured`` | ``compiled`` | ``library`` | ``library>=N``; ValueError otherwise."""
        value = text.strip().lower()
        if value in ("measured", COMPILED, LIBRARY):
            return cls(value)
        if value.startswith(LIBRARY + ">="):
            rows = value.removeprefix(LIBRARY + ">=")
            if rows.isdigit() and int(rows) >= 1:
                return cls(LIBRARY, int(rows))
        raise ValueError(
            f"{CHOICE_ENV}={text!r}: choose measured, compiled, library or library>=ROWS"
        )

    def __str__(self) -> str:
        return self.mode + (f">={self.library_from_rows}" if self.library_from_rows > 1 else "")


def current_policy() -> Policy:
    """The policy ``PREFIXCACHE_KERNEL_CHOICE`` sets (``measured`` when unset)."""
    return Policy.parse(os.environ.get(CHOICE_ENV, "measured"))


@dataclass
class KernelChoice:
    """Per op name (``qkv``, ``o``, ``gate_up``, ``down``, ``head``, ``attention``), per bucket:
    the implementation that runs (``compiled``, ``onednn`` or ``sdpa``), and (when measured) the
    seconds per call of each candidate. ``source`` says where it came from: ``measured``,
    ``cache`` or ``env``."""

    chosen: dict[str, dict[int, str]]
    seconds: dict[str, dict[int, dict[str, float]]] = field(default_factory=dict)
    source: str = "measured"
    key: dict[str, object] = field(default_factory=dict)

    def implementation(self, name: str, rows: int) -> str:
        """The implementation op ``name`` runs for a call of ``rows`` rows (the compiled kernel
        below the op's smallest bucket)."""
        buckets = self.chosen.get(name, {})
        eligible = [b for b in buckets if b <= rows]
        return buckets[max(eligible)] if eligible else COMPILED

    def library_buckets(self, name: str) -> frozenset[int]:
        """The buckets where op ``name`` runs its library."""
        return frozenset(b for b, impl in self.chosen.get(name, {}).items() if impl != COMPILED)

    def layers_fused(self, rows: int) -> bool:
        """Whether a step of ``rows`` rows runs the decoder layers as fused compiled calls
        (every layer op on its compiled kernel in that bucket)."""
        return all(self.implementation(name, rows) == COMPILED for name in LAYER_OPS)

    def summary(self) -> str:
        """One line: what runs a library, or that the compiled kernels run everything."""
        parts = []
        for name, buckets in self.chosen.items():
            on = sorted(b for b, impl in buckets.items() if impl != COMPILED)
            if on:
                parts.append(f"{buckets[on[0]]} for {name} from {on[0]} rows"
                             + ("" if on == [b for b in sorted(buckets) if b >= on[0]] else
                                f" (at {','.join(map(str, on))})"))  # fmt: skip
        if not parts:
            return "the compiled kernels for every op and row count"
        return "; ".join(parts) + "; the compiled kernels elsewhere"

    def to_json(self) -> dict[str, object]:
        return {
            "schema": _SCHEMA, "key": self.key, "chosen": self.chosen, "seconds": self.seconds,
        }  # fmt: skip

    @classmethod
    def from_json(cls, data: Mapping[str, object], source: str) -> KernelChoice:
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
    """The choice from measured seconds per call (op -> bucket -> implementation -> seconds):
    the library (the candidate other than ``compiled``) where it beats the compiled kernel by
    ``margin``; then, per bucket, the layer ops go back to the compiled kernels unless the
    layer's summed time drops by ``margin`` (running op by op is only worth a real gain).
    Pure: the tests feed it numbers."""
    chosen: dict[str, dict[int, str]] = {}
    for name, buckets in seconds.items():
        chosen[name] = {}
        for bucket, times in buckets.items():
            ours = times.get(COMPILED)
            others = [impl for impl in times if impl != COMPILED]
            best = min(others, key=times.__getitem__) if others else None
            wins = best is not None and (ours is None or times[best] <= ours * (1 - margin))
            chosen[name][bucket] = best if wins else COMPILED  # type: ignore[assignment]
    layer = [name for name in LAYER_OPS if name in seconds]
    for bucket in {b for name in layer for b in seconds[name]}:
        timed = [seconds[name][bucket] for name in layer if bucket in seconds[name]]
        if any(COMPILED not in times for times in timed):
            continue  # no compiled kernel to stay on
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


def forced_choice(shapes: Sequence[OpShape], policy: Policy) -> KernelChoice:
    """The choice ``policy`` (``compiled`` or ``library``) imposes, without measuring."""

    def implementation(shape: OpShape, bucket: int) -> str:
        if policy.mode == LIBRARY and bucket >= policy.library_from_rows:
            return shape.library
        return COMPILED

    chosen = {s.name: {b: implementation(s, b) for b in s.buckets} for s in shapes}
    return KernelChoice(chosen, source="env")


def choice_key(shapes: Sequence[OpShape], dtype: torch.dtype) -> dict[str, object]:
    """What a measured choice depends on: the machine, torch, threads, dtype and shapes."""
    return {
        "schema": _SCHEMA, "cpu": cpu_model(), "flags": sorted(cpu_flags()),
        "machine": platform.machine(), "torch": torch.__version__,
        "threads": torch.get_num_threads(), "dtype": str(dtype).removeprefix("torch."),
        "shapes": [s.key() for s in shapes],
        "margin": MARGIN,
    }  # fmt: skip


def choice_path(key: Mapping[str, object]) -> Path:
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:24]
    return cache_dir() / "choices" / f"kernels-{digest}.json"


def choose_kernels(
    shapes: Sequence[OpShape], dtype: torch.dtype, remeasure: bool = False
) -> KernelChoice:
    """The kernel choice for a model of these op shapes in ``dtype`` on this machine:
    the environment's forced policy, else the cached measurement, else a new measurement
    (cached, unless the cache directory cannot be written). Logs one line."""
    policy = current_policy()
    if policy.mode != "measured":
        choice = forced_choice(shapes, policy)
        log.info("kernel choice (%s=%s): %s", CHOICE_ENV, policy, choice.summary())
        return choice
    key = choice_key(shapes, dtype)
    path = choice_path(key)
    if not remeasure:
        try:
            data = json.loads(path.read_text())
            if data.get("key") == key:
                choice = KernelChoice.from_json(data, "cache")
                log.info("kernel choice (cached, %s): %s", path, choice.summary())
                return choice
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            pass  # absent or unreadable: measure again
    start = time.perf_counter()
    seconds = {s.name: measure_op(s, dtype) for s in shapes}
    choice = KernelChoice(decide(seconds), seconds, "measured", key)
    _write_atomically(path, json.dumps(choice.to_json(), indent=1))
    log.info(
        "kernel choice (measured in %.2f s on %s): %s",
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
        log.debug("kernel choice not cached at %s: %s", path, exc)


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo``), else the platform's processor string."""
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"
