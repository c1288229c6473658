"""Shared fixtures: a tiny chat-capable model, an engine on it, a live uvicorn server."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from integration_helpers import CHATML_TEMPLATE, SERVED_NAME, make_llm
from tiny_model_factory import make_tiny_model_dir

from prefixcache.engine.async_llm import AsyncLLM
from prefixcache.integrations.server import BackgroundServer, build_app


@pytest.fixture(scope="session")
def tiny_chat_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny random Llama plus a ChatML chat template."""
    folder = make_tiny_model_dir(tmp_path_factory.mktemp("tiny-chat"), "llama")
    (folder / "chat_template.jinja").write_text(CHATML_TEMPLATE)
    return folder


@pytest.fixture(scope="module")
def engine(tiny_chat_dir: Path) -> Iterator[AsyncLLM]:
    engine = AsyncLLM(make_llm(tiny_chat_dir))
    yield engine
    engine.shutdown()


@pytest.fixture(scope="module")
def server(engine: AsyncLLM) -> Iterator[BackgroundServer]:
    with BackgroundServer(build_app(engine, model_name=SERVED_NAME, max_pending=64)) as running:
        yield running


@pytest.fixture(scope="session")
def tiny_tools_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny chat model with room for tools' instructions (its byte-sized vocabulary spends
    ~700 tokens on them): a 4,096-token context."""
    folder = make_tiny_model_dir(tmp_path_factory.mktemp("tiny-tools"), "llama",
                                 max_position_embeddings=4096)  # fmt: skip
    (folder / "chat_template.jinja").write_text(CHATML_TEMPLATE)
    return folder


@pytest.fixture(scope="module")
def tools_server(tiny_tools_dir: Path) -> Iterator[BackgroundServer]:
    """A live server on the tiny tools model."""
    engine = AsyncLLM(make_llm(tiny_tools_dir, num_blocks=1024, block_size=16))
    try:
        with BackgroundServer(build_app(engine, model_name=SERVED_NAME)) as running:
            yield running
    finally:
        engine.shutdown()
