"""Suite-wide settings.

The engine's GEMM choice (``prefixcache.kernels.cpu.kernel_choice``) is pinned to the compiled
GEMM unless the environment names another: a measured choice may mix oneDNN into some row
counts on some CPUs (AMX), and the suite's bitwise cached == uncached checks hold for one GEMM
per projection. The choice's own tests set the variable themselves.

The checkout's root is taken off ``sys.path`` (``python -m pytest`` puts it first): its folders
are installed as ``prefixcache.engine`` / ``.kernels`` / ``.integrations``, and on the path the
folder ``kernels/`` would shadow the PyPI package ``kernels`` that transformers imports.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

os.environ.setdefault("PREFIXCACHE_KERNEL_CHOICE", "compiled")

_ROOT = Path(__file__).resolve().parent.parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _ROOT]
