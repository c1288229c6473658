"""Where every benchmark's JSON report goes: one writer, so all of them read the same way."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def write_json(path: Path | str, report: Any) -> Path:
    """Write ``report`` to ``path`` as indented JSON (creating its folder) and say so on
    stdout; returns the path."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {path}")
    return target
