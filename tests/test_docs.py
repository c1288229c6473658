"""The documentation stays true: the site builds with ``mkdocs build --strict`` (no broken
link, no missing page, the generated references build), and the README's code blocks marked
``<!-- test: run -->`` run and print what the README shows (model text aside: a quoted string
may differ on another CPU; the counts may not)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RUNNABLE = re.compile(r"<!-- test: run -->\n```python\n(.*?)```\n+```text\n(.*?)```", re.S)
QUOTED = re.compile(r"'(?:[^'\\]|\\.)*'" + r'|"(?:[^"\\]|\\.)*"')  # both quote styles of repr()


def test_the_site_builds_strictly(tmp_path: Path) -> None:
    pytest.importorskip("mkdocs", reason="needs the docs extra: pip install -e '.[docs]'")
    pytest.importorskip("material", reason="needs the docs extra: pip install -e '.[docs]'")
    completed = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(tmp_path / "site")],
        cwd=ROOT, capture_output=True, text=True, timeout=600,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )  # fmt: skip
    assert completed.returncode == 0, completed.stderr[-4000:]
    cli = (tmp_path / "site" / "reference" / "cli" / "index.html").read_text()
    assert "prefixcache serve" in cli and "--kv-events" in cli  # generated from the CLI
    http = (tmp_path / "site" / "reference" / "http-api" / "index.html").read_text()
    assert "/v1/chat/completions" in http and "prompt_logprobs" in http


def readme_blocks() -> list[tuple[str, str]]:
    return RUNNABLE.findall((ROOT / "README.md").read_text())


def test_readme_marks_its_runnable_blocks() -> None:
    assert len(readme_blocks()) >= 2


@pytest.mark.parametrize("number", range(len(readme_blocks())))
def test_readme_block_runs_and_prints_what_it_shows(number: int) -> None:
    code, shown = readme_blocks()[number]
    completed = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                               timeout=600, cwd=ROOT)  # fmt: skip
    assert completed.returncode == 0, completed.stderr[-3000:]
    printed = completed.stdout.strip().splitlines()
    expected = shown.strip().splitlines()
    assert [QUOTED.sub("…", line) for line in printed] == [
        QUOTED.sub("…", line) for line in expected]
