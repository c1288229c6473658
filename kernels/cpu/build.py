"""Compile the CPU kernels with the system gcc at first use and load them with ctypes, as two
shared libraries: the AVX-512/BF16 one (``paged_attention.c``, ``model_ops.c``, ``linear.c``,
``greedy_screen.c``, ``decoder_layer.c``; ``load_library()``) and the AVX2/FMA one for float32
(``paged_attention_f32.c``, ``linear_f32.c``, ``model_ops_f32.c``, ``decoder_layer_f32.c``;
``load_f32_library()``),
each built only where the CPU has its instruction sets.

A shared library is cached as ``$XDG_CACHE_HOME/prefixcache/kernels/<name>-<hash>.so``
(default ``~/.cache``), the hash covering the sources and headers, the compiler command and
version, the CPU flags and the OpenMP runtime it links; it is written to a temporary file and
renamed into place, so concurrent processes never see a partial file. It is linked against the
OpenMP runtime torch itself loaded (the ``libgomp`` bundled in pip wheels), so torch and the
kernels share one thread pool instead of two runtimes spinning against each other.

``load_library()`` / ``load_f32_library()`` return the loaded library or None, never raise;
the reason it is None is logged once at debug level. ``PREFIXCACHE_CPU_KERNELS=0`` (read when
the kernels are first asked for) disables both.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

log = logging.getLogger(__name__)

_HERE = Path(__file__).parent
SOURCES = tuple(
    _HERE / name
    for name in (
        "paged_attention.c", "model_ops.c", "linear.c", "decoder_layer.c", "phase_profile.c",
        "work_runs.c", "greedy_screen.c",
    )
)  # fmt: skip
HEADERS = tuple(
    _HERE / name
    for name in (
        "cpu_kernels.h", "simd_math.h", "work_runs.h", "layer_args.h", "thread_scratch.h",
    )
)  # fmt: skip
REQUIRED_CPU_FLAGS = ("avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_bf16")
# -fschedule-insns with -fsched-pressure: gcc also schedules before register allocation,
# minding register pressure; the GEMM epilogues and the attention's softmax interleave better
# (bitwise the same code paths, a warm request ~1% faster). Without -fsched-pressure it spills.
COMPILE_FLAGS = (
    "-O3", "-fPIC", "-std=gnu11", "-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq",
    "-mavx512bf16", "-mfma", "-fopenmp", "-fschedule-insns", "-fsched-pressure",
)  # fmt: skip
F32_SOURCES = tuple(
    _HERE / name
    for name in (
        "paged_attention_f32.c", "linear_f32.c", "model_ops_f32.c", "decoder_layer_f32.c",
        "fma_peak_f32.c", "windowed_attention.c",
    )
)  # fmt: skip
F32_HEADERS = tuple(
    _HERE / name
    for name in ("simd_math_avx2.h", "cpu_kernels_f32.h", "layer_args.h", "thread_scratch.h")
)
F32_REQUIRED_CPU_FLAGS = ("avx2", "fma")
F32_COMPILE_FLAGS = ("-O3", "-fPIC", "-std=gnu11", "-mavx2", "-mfma", "-fopenmp")


@dataclass(frozen=True)
class LibrarySpec:
    """One shared library: what it is built from, with what, and for which CPUs."""

    name: str
    sources: tuple[Path, ...]
    headers: tuple[Path, ...]
    flags: tuple[str, ...]
    required_cpu_flags: tuple[str, ...]
    declare: Callable[[ctypes.CDLL], None]


_lock = threading.Lock()
_state: dict[str, dict[str, object]] = {}  # per library: "lib": CDLL | None, "reason": str


@functools.cache
def kernels_enabled() -> bool:
    """False when ``PREFIXCACHE_CPU_KERNELS`` is set to 0/false/off/no. Read once, at the first
    call (every kernel dispatch asks); ``kernels_enabled.cache_clear()`` reads it again."""
    value = os.environ.get("PREFIXCACHE_CPU_KERNELS", "1").strip().lower()
    return value not in ("0", "false", "off", "no")


def cpu_flags() -> set[str]:
    """The flags of the first processor in /proc/cpuinfo (empty when unreadable)."""
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def torch_openmp_runtime() -> Path | None:
    """The libgomp torch uses: the one bundled in torch/lib, else one already mapped into this
    process (system torch builds), else None (then gcc's default libgomp is linked)."""
    bundled = sorted((Path(torch.__file__).parent / "lib").glob("libgomp*.so*"))
    if bundled:
        return bundled[0]
    try:
        with open("/proc/self/maps", encoding="ascii", errors="replace") as f:
            for line in f:
                path = line.split()[-1]
                if "/libgomp" in path and ".so" in path:
                    return Path(path)
    except OSError:
        pass
    return None


def cache_dir() -> Path:
    """``$XDG_CACHE_HOME/prefixcache/kernels`` (``~/.cache`` when unset)."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "prefixcache" / "kernels"


def _run(cmd: list[str]) -> None:
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed: {done.stderr.strip()[-2000:]}")


def _compile(spec: LibrarySpec, gcc: str, gomp: Path | None, target: Path) -> None:
    """Compile and link into ``target`` atomically (temporary file, then rename)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=target.stem, suffix=".tmp")
    os.close(fd)
    objects = [f"{tmp}.{source.stem}.o" for source in spec.sources]
    try:
        for source, obj in zip(spec.sources, objects, strict=True):
            _run([gcc, *spec.flags, "-c", str(source), "-o", obj])
        # link the exact runtime torch loaded (same soname, so one copy at run time)
        link = ["-fopenmp"] if gomp is None else [str(gomp), f"-Wl,-rpath,{gomp.parent}"]
        _run([gcc, "-shared", *objects, *link, "-lm", "-o", tmp])
        os.chmod(tmp, 0o755)
        os.replace(tmp, target)
    finally:
        for path in (tmp, *objects):
            if os.path.exists(path):
                os.remove(path)


def build_library(spec: LibrarySpec) -> ctypes.CDLL:
    """Compile ``spec``'s library (or find it in the cache, keyed by its sources, flags and
    compiler) and load it; RuntimeError when it cannot be built here. The kernels load theirs
    through ``load_library`` / ``load_f32_library``; this is for tools that build variants,
    such as a benchmark timing another revision's sources side by side."""
    if platform.system() != "Linux" or platform.machine().lower() not in ("x86_64", "amd64"):
        raise RuntimeError(f"needs x86-64 Linux, not {platform.system()} {platform.machine()}")
    missing = [flag for flag in spec.required_cpu_flags if flag not in cpu_flags()]
    if missing:
        raise RuntimeError(f"CPU lacks {', '.join(missing)}")
    gcc = shutil.which("gcc")
    if gcc is None:
        raise RuntimeError("gcc not found on PATH")
    version = subprocess.run(
        [gcc, "-dumpfullversion"], capture_output=True, text=True, timeout=30, check=False
    ).stdout.strip()
    gomp = torch_openmp_runtime()
    key = hashlib.sha256()
    sources = (path.read_bytes() for path in (*spec.sources, *spec.headers))
    parts = (*sources, gcc, version, " ".join(spec.flags), " ".join(sorted(cpu_flags())),
             str(gomp))  # fmt: skip
    for part in parts:
        key.update(part if isinstance(part, bytes) else part.encode())
        key.update(b"\0")
    target = cache_dir() / f"{spec.name}-{key.hexdigest()[:24]}.so"
    if not target.exists():
        try:
            _compile(spec, gcc, gomp, target)
        except OSError:  # cache not writable: build in a private temporary folder
            target = Path(tempfile.mkdtemp(prefix="prefixcache-kernels-")) / target.name
            _compile(spec, gcc, gomp, target)
    lib = ctypes.CDLL(str(target))
    spec.declare(lib)
    return lib


def _declare_layer_ops(lib: ctypes.CDLL, prefix: str) -> None:
    """The functions both libraries export with one C signature each, named ``prefix`` +
    name ("pc_" bf16, "pc_f32_" float32; element pointers are void* here): the elementwise ops,
    the KV store and the fused decoder layers."""
    ptr, i64, i32, f32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int, ctypes.c_float
    signatures = {
        "rms_norm": (None, [
            ptr, i64, ptr, i64, ptr, ptr, i64,  # x, stride, residual, stride, weight, out, stride
            i64, i64, f32, i32,  # rows, hidden, eps, num_threads
        ]),
        "rotary": (None, [
            ptr, i64, i64, ptr, i64,  # x, token stride, head stride, cos_sin, token stride
            i64, i64, i64, i32,  # tokens, num_heads, head_dim, num_threads
        ]),
        # gate_up, row stride, out, row stride, rows, intermediate, num_threads
        "silu_and_mul": (None, [ptr, i64, ptr, i64, i64, i64, i32]),
        "store_kv": (i32, [
            ptr, i64, i64, ptr, i64, i64,  # k, token stride, head stride, v, ...
            ptr, ptr, ptr,  # k_cache, v_cache, slots (int64)
            i64, i64, i64, i64,  # tokens, num_kv_heads, head_dim, num_slots
        ]),
        # layer_args[n] (decoder_layer.py), n, the step's layer_args, *failed
        "decoder_layers": (i32, [ptr, i64, ptr, ptr]),
        "release_layer_scratch": (None, []),
    }  # fmt: skip
    for name, (restype, argtypes) in signatures.items():
        function = getattr(lib, prefix + name)
        function.restype = restype
        function.argtypes = argtypes


def _declare(lib: ctypes.CDLL) -> None:
    ptr, i64, i32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int
    _declare_layer_ops(lib, "pc_")
    lib.pa_paged_attention.restype = i32
    lib.pa_paged_attention.argtypes = [
        ptr, i64, i64,  # q, token stride, head stride
        ptr, i64, i64,  # k
        ptr, i64, i64,  # v
        ptr, ptr, i32,  # k_cache, v_cache, pool element type (0 bf16, 1 int8, 2 fp8)
        ptr, ptr, i64,  # k_scale, v_scale (float32 [num_kv_heads, head_dim]), num_blocks
        ptr, i64, i64,  # block_tables, row stride, max_blocks
        ptr, ptr, i32, i64,  # starts, lens, num_seqs, num_tokens
        ptr, i32, i32, i32, i32,  # out, num_heads, num_kv_heads, head_dim, block_size
        ctypes.c_float, ctypes.c_bool, i32,  # scale, decode, num_threads
    ]  # fmt: skip
    lib.pa_release_workspace.restype = None
    lib.pa_release_workspace.argtypes = []
    lib.pc_linear.restype = None
    lib.pc_linear.argtypes = [
        ptr, i64, i64, i64,  # x, row stride, rows, input pairs
        ptr, i64, ptr, ptr, i64, i32,  # packed weight, n_out, bias, out, row stride, threads
    ]  # fmt: skip
    lib.pc_profile_enable.restype = None
    lib.pc_profile_enable.argtypes = [i32]
    lib.pc_profile_read.restype = None
    lib.pc_profile_read.argtypes = [ptr, i32]  # double[PC_NUM_PHASES], reset
    lib.pc_bf16_dot_gflops.restype = ctypes.c_double
    lib.pc_bf16_dot_gflops.argtypes = [i32, i64]
    lib.pc_copy_blocks.restype = i32
    lib.pc_copy_blocks.argtypes = [ptr, i64, i64, i64, ptr, i64, ptr]  # pools, n, bytes, ...
    lib.pc_work_runs_drain.restype = i64
    lib.pc_work_runs_drain.argtypes = [i64, i32, i32, ptr]  # n, runs, tid, out int64[n]
    lib.pc_screen_pack.restype = i32
    lib.pc_screen_pack.argtypes = [ptr, i64, i64, ptr, ptr, i32]  # w, n, k, q, meta, threads
    lib.pc_greedy_head.restype = i32
    lib.pc_greedy_head.argtypes = [
        ptr, i64, i64, ptr, ptr, ptr,  # x, x_stride, rows, q, meta, packed
        i64, i64, i64, ptr, i32,  # n, k, max_exact_strips, tokens (int64), threads
    ]  # fmt: skip
    lib.pc_work_runs_stress.restype = None
    lib.pc_work_runs_stress.argtypes = [i64, i32, i32, ptr]  # n, runs, repeats, taken int32[n]


def _declare_f32(lib: ctypes.CDLL) -> None:
    ptr, i64, i32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int
    _declare_layer_ops(lib, "pc_f32_")
    lib.pa_f32_attention.restype = i32
    lib.pa_f32_attention.argtypes = [
        ptr, i64, i64, ptr, i64, i64, ptr, i64, i64,  # q, k, v with token and head strides
        ptr, ptr, i64,  # k_cache, v_cache, num_blocks
        ptr, i64, i64,  # block_tables, row stride, max_blocks
        ptr, ptr, i32, i64,  # starts (NULL: decode), lens, num_seqs, num_tokens
        ptr, i64, i64,  # out, token stride, head stride
        i32, i32, i32, i32,  # num_heads, num_kv_heads, head_dim, block_size
        ctypes.c_float, i32,  # scale, num_threads
    ]  # fmt: skip
    lib.wa_windowed_attention.restype = None
    lib.wa_windowed_attention.argtypes = [
        ptr, i32, i64, i64,  # q, q is bf16, token and head strides
        ptr, ptr, i32,  # k_cache, v_cache, pools are bf16
        ptr, i64, ptr, ptr, i64,  # block_tables, row stride, seq_of int32, pos_of int64, tokens
        i32, i32, i32, i32, i32,  # num_heads, num_kv_heads, head_dim, block_size, window
        ctypes.c_float, ptr, i32, i32,  # scale, out, out is bf16, num_threads
    ]  # fmt: skip
    lib.pc_f32_fma_gflops.restype = ctypes.c_double
    lib.pc_f32_fma_gflops.argtypes = [i32, i64]  # threads, rounds
    lib.pc_f32_linear.restype = None
    lib.pc_f32_linear.argtypes = [
        ptr, i64, i64, i64,  # x, row stride, rows, k
        ptr, i64, ptr, ptr, i64, i32,  # packed weight, n_out, bias, out, row stride, threads
    ]  # fmt: skip


AVX512_LIBRARY = LibrarySpec(
    "cpu_kernels", SOURCES, HEADERS, COMPILE_FLAGS, REQUIRED_CPU_FLAGS, _declare
)
F32_LIBRARY = LibrarySpec(
    "cpu_kernels_f32", F32_SOURCES, F32_HEADERS, F32_COMPILE_FLAGS, F32_REQUIRED_CPU_FLAGS,
    _declare_f32,
)


def _load(spec: LibrarySpec) -> ctypes.CDLL | None:
    if not kernels_enabled():
        return None
    state = _state.get(spec.name)
    if state is not None:
        return state["lib"]  # type: ignore[return-value]
    with _lock:
        if spec.name not in _state:
            try:
                _state[spec.name] = {"lib": build_library(spec)}
            except Exception as exc:  # unavailable, never fatal
                _state[spec.name] = {"lib": None, "reason": str(exc)}
                log.debug("CPU kernels %s unavailable: %s", spec.name, exc)
        return _state[spec.name]["lib"]  # type: ignore[return-value]


def load_library() -> ctypes.CDLL | None:
    """The compiled AVX-512/BF16 kernel library, or None when unavailable (reason logged
    once)."""
    return _load(AVX512_LIBRARY)


def load_f32_library() -> ctypes.CDLL | None:
    """The compiled AVX2/FMA float32 library (attention, GEMM, elementwise ops), or None when
    unavailable."""
    return _load(F32_LIBRARY)


def unavailable_reason(spec: LibrarySpec = AVX512_LIBRARY) -> str | None:
    """Why the library of ``spec`` (default: the AVX-512 one) did not load, if it did not."""
    if not kernels_enabled():
        return "disabled by PREFIXCACHE_CPU_KERNELS=0"
    _load(spec)
    return _state[spec.name].get("reason")  # type: ignore[return-value]
