"""Kernel tests run the Triton kernels in Triton's CPU interpreter.

``TRITON_INTERPRET=1`` must be in the environment before triton is first imported; pytest
imports this conftest before any test module of the folder, and ``prefixcache.kernels``
imports triton only lazily, so setting it here is early enough.
"""

from __future__ import annotations

import os

os.environ["TRITON_INTERPRET"] = "1"
