"""Checks that a run's output paths can be written, done before anything runs: a benchmark
must not measure for minutes and then lose its results to a path that was never writable."""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path


def check_output_dir(folder: Path, file_names: Iterable[str]) -> None:
    """ValueError unless ``folder`` is a writable directory, or can be created as one, in
    which each of ``file_names`` can be written (none of them is a directory)."""
    if _exists(folder):
        if not folder.is_dir():
            raise ValueError(f"output directory {str(folder)!r} exists and is not a directory")
        _check_writable_dir(folder, f"output directory {str(folder)!r}")
        for name in file_names:
            check_output_file(folder / name, "output file")
    else:
        _check_creatable(folder, f"output directory {str(folder)!r}")


def check_output_file(path: Path, what: str) -> None:
    """ValueError unless ``path`` is a writable file or can be created (with any missing
    parent folders); ``what`` names the file in the message ("request list file")."""
    label = f"{what} {str(path)!r}"
    if _exists(path):
        if path.is_dir():
            raise ValueError(f"{label} is a directory")
        if not os.access(path, os.W_OK):
            raise ValueError(f"{label} is not writable")
        return
    _check_creatable(path, label)


def _check_creatable(path: Path, label: str) -> None:
    """ValueError unless the nearest existing ancestor of ``path`` is a writable directory."""
    ancestor = next(parent for parent in path.absolute().parents if _exists(parent))
    if not ancestor.is_dir():
        raise ValueError(f"{label} cannot be created: {str(ancestor)!r} is not a directory")
    _check_writable_dir(ancestor, f"{label} cannot be created: {str(ancestor)!r}")


def _check_writable_dir(folder: Path, label: str) -> None:
    if not os.access(folder, os.W_OK | os.X_OK):
        raise ValueError(f"{label} is not writable")


def _exists(path: Path) -> bool:
    """True if anything (a dangling link too) is at ``path``; ValueError if it cannot be
    checked (a parent folder without search permission)."""
    try:
        return path.exists() or path.is_symlink()
    except OSError as error:
        raise ValueError(f"cannot check {str(path)!r}: {error.strerror or error}") from error
