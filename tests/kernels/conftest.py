"""Kernel tests run the Triton kernels in Triton's CPU interpreter.

``TRITON_INTERPRET=1`` must be in the environment before triton is first imported; pytest
imports this conftest before any test module of the folder, and ``prefixcache.kernels``
imports triton only lazily, so setting it here is early enough.

The ``threads`` fixture runs a compiled CPU kernel test on 1 and on 2 torch threads.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
import torch

os.environ["TRITON_INTERPRET"] = "1"


@pytest.fixture(params=[1, 2], ids=["1thread", "2threads"])
def threads(request: pytest.FixtureRequest) -> Iterator[int]:
    previous = torch.get_num_threads()
    torch.set_num_threads(request.param)
    yield request.param
    torch.set_num_threads(previous)
