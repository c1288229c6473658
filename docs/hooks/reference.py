"""MkDocs hook: pages that say ``<!-- generated: cli -->`` or ``<!-- generated: http -->``
get the CLI's help or the HTTP API's schema, generated from the code at build time; a page
that says ``<!-- report: runs/NAME.json -->`` gets the tables of that benchmark run
(``docs/runs/``, rendered by ``benchmarks/report.py``, its machine and revision included);
``<!-- report: runs/NAME.json KEY ... -->`` only those top-level entries of it.

The repository installs ``engine/``, ``kernels/`` and ``integrations/`` as subpackages of
``prefixcache`` (pyproject ``package-dir``); mkdocstrings reads sources by import path, so
``build/docs_src/prefixcache`` is laid out here as the installed package is (links), and
mkdocs.yml points mkdocstrings at it.
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
SOURCE_TREE = ROOT / "build" / "docs_src" / "prefixcache"


def _lay_out_sources() -> None:
    SOURCE_TREE.mkdir(parents=True, exist_ok=True)
    links = {path.name: path for path in (ROOT / "prefixcache").iterdir()}
    links.update(engine=ROOT / "engine", kernels=ROOT / "kernels",
                 integrations=ROOT / "integrations")  # fmt: skip
    for stale in SOURCE_TREE.iterdir():  # a file removed since the last build
        if stale.is_symlink() and (stale.name not in links or not stale.exists()):
            stale.unlink()
    for name, target in links.items():
        link = SOURCE_TREE / name
        if link.is_symlink() or link.exists():
            continue
        link.symlink_to(target)


_lay_out_sources()


REPORT = re.compile(r"<!-- report: (runs/[\w.-]+\.json)((?: \w+)*) -->")


def _report(match: re.Match) -> str:
    spec = importlib.util.spec_from_file_location("report", ROOT / "benchmarks" / "report.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    keys = match.group(2).split()  # the report's top-level entries to show (default: all)
    return module.report_markdown(ROOT / "docs" / match.group(1), level=3, keys=keys)


def on_page_markdown(markdown: str, **_: Any) -> str:
    markdown = REPORT.sub(_report, markdown)
    if "<!-- generated: cli -->" in markdown:
        from prefixcache.integrations.docs_reference import cli_reference

        markdown = markdown.replace("<!-- generated: cli -->", cli_reference())
    if "<!-- generated: http -->" in markdown:
        from prefixcache.integrations.docs_reference import http_reference

        markdown = markdown.replace("<!-- generated: http -->", http_reference())
    return markdown
