"""Holding an ``AsyncLLM``'s engine thread between steps, so a test acts while requests are
known to be in flight."""

from __future__ import annotations

import asyncio
import threading
from typing import Any


class EngineGate:
    """Holds the engine thread between steps (via ``AsyncLLM.call``) while the block is open,
    so a test can act while requests are known to be in flight. ``stats`` is a snapshot taken
    on the engine thread when the gate closed."""

    def __init__(self, engine: Any) -> None:
        self._engine = engine
        self._inside = threading.Event()
        self._release = threading.Event()
        self.stats: dict[str, Any] = {}
        self._thread = threading.Thread(target=self._hold, daemon=True)

    def _hold(self) -> None:
        def wait_on_engine_thread(llm: Any) -> None:
            self.stats = llm.stats()
            self._inside.set()
            self._release.wait(60)

        asyncio.run(self._engine.call(wait_on_engine_thread))

    def __enter__(self) -> EngineGate:
        self._thread.start()
        assert self._inside.wait(60), "the engine thread never reached the gate"
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._release.set()
        self._thread.join(60)
