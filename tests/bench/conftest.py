"""Fixtures: a tiny random model folder, and the embedded-engine options built on it."""

from __future__ import annotations

from pathlib import Path

import pytest
from tiny_model_factory import make_tiny_model_dir

TINY_VOCAB = 384  # make_tiny_model_dir's vocabulary


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_model_dir(tmp_path_factory.mktemp("bench-tiny-llama"), "llama")
