"""Fixtures for the model-layer tests."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from model_layer_helpers import save_hf_folder, tiny_hf_model


@pytest.fixture
def make_hf_folder(tmp_path: Path) -> Callable[..., tuple[Any, Path]]:
    """Factory: `(hf_model, folder)` for a tiny random model saved under tmp_path."""
    counter = iter(range(1000))

    def make(architecture: str = "llama", **overrides: Any) -> tuple[Any, Path]:
        model = tiny_hf_model(architecture, **overrides)
        return model, save_hf_folder(model, tmp_path / f"model{next(counter)}")

    return make

