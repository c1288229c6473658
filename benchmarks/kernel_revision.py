"""The float32 CPU kernel library built from another git revision's sources, so a benchmark
can time a kernel change against its parent side by side in one run (``--against REV``):
timed one after the other in separate runs, the two meet different moments of a shared
machine, whose load moves a kernel's time by more than most changes do."""

from __future__ import annotations

import ctypes
import dataclasses
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType
from typing import Any

from prefixcache.kernels.cpu.build import F32_LIBRARY, build_library


def _git(root: Path, *args: str) -> bytes:
    done = subprocess.run(["git", "-C", str(root), *args], capture_output=True, timeout=60,
                          check=False)  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(f"git {' '.join(args)}: {done.stderr.decode().strip()}")
    return done.stdout


def f32_library_at(revision: str) -> ctypes.CDLL:
    """The float32 library compiled from ``revision``'s versions of today's source files;
    RuntimeError when the revision is unknown or lacks one of them."""
    here = Path(F32_LIBRARY.sources[0]).parent
    root = Path(_git(here, "rev-parse", "--show-toplevel").decode().strip())
    commit = _git(root, "rev-parse", "--verify", f"{revision}^{{commit}}").decode().strip()
    with tempfile.TemporaryDirectory(prefix="prefixcache-kernels-at-") as name:
        folder = Path(name)  # the sources, for the compile only (the library goes to the cache)
        for path in (*F32_LIBRARY.sources, *F32_LIBRARY.headers):
            relative = Path(path).resolve().relative_to(root).as_posix()
            (folder / Path(path).name).write_bytes(_git(root, "show", f"{commit}:{relative}"))
        spec = dataclasses.replace(
            F32_LIBRARY,
            name=f"{F32_LIBRARY.name}-at-{commit[:12]}",
            sources=tuple(folder / Path(p).name for p in F32_LIBRARY.sources),
            headers=tuple(folder / Path(p).name for p in F32_LIBRARY.headers),
        )
        return build_library(spec)


@contextmanager
def f32_library_in(module: ModuleType, library: ctypes.CDLL) -> Iterator[None]:
    """Within the block, ``module``'s kernel wrappers call ``library`` instead of their own."""
    own = module.load_f32_library
    module.load_f32_library = lambda: library
    try:
        yield
    finally:
        module.load_f32_library = own


def run_with(module: ModuleType, library: ctypes.CDLL, call: Callable[[], Any]) -> Callable:
    """``call`` made to run on ``library`` (see ``f32_library_in``)."""

    def swapped() -> Any:
        with f32_library_in(module, library):
            return call()

    return swapped
