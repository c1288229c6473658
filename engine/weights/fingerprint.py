"""A stable identifier of a model's weights, used to namespace the prefix cache."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import xxhash

# Bytes hashed from the start and from the end of each file: cheap, yet two fine-tunes of
# one architecture (same names and sizes) still get different fingerprints.
_SAMPLE_BYTES = 1 << 20


def weights_fingerprint(architecture: str, files: Sequence[Path]) -> str:
    """`"<architecture>-<16 hex>"` from each file's name, size, first and last MiB.

    Independent of the folder location and of timestamps, so it is stable across machines.
    """
    digest = xxhash.xxh3_64()
    digest.update(architecture.encode())
    for path in sorted(files, key=lambda p: p.name):
        size = path.stat().st_size
        digest.update(f"\0{path.name}\0{size}\0".encode())
        with path.open("rb") as handle:
            digest.update(handle.read(_SAMPLE_BYTES))
            if size > _SAMPLE_BYTES:
                handle.seek(max(_SAMPLE_BYTES, size - _SAMPLE_BYTES))
                digest.update(handle.read(_SAMPLE_BYTES))
    return f"{architecture}-{digest.hexdigest()}"
