"""Suite-wide settings.

The engine's GEMM choice (``prefixcache.kernels.cpu.kernel_choice``) is pinned to the compiled
GEMM unless the environment names another: a measured choice may mix oneDNN into some row
counts on some CPUs (AMX), and the suite's bitwise cached == uncached checks hold for one GEMM
per projection. The choice's own tests set the variable themselves.
"""

from __future__ import annotations

import os

os.environ.setdefault("PREFIXCACHE_KERNEL_CHOICE", "compiled")
