"""Turn a benchmark's JSON report into the Markdown tables the docs show, headed by the run it
came from (CPU, kernel flags, torch, git revision, date), so no figure is typed by hand.

    python benchmarks/report.py results/sliding_window.json [more.json ...] [--out FILE.md]

Lists of objects become one table each (a column per key); objects of numbers or strings
with the same keys one table (a row each), a single one a two-column table; other nested
objects a section each.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any


def run_line(run: dict[str, Any] | None) -> str:
    if not run:
        return "_Run not recorded (a report written before runs were recorded)._"
    flags = ", ".join(run.get("kernel_flags", [])) or "none of the kernel flags"
    return (f"_{run.get('cpu', '?')} (family {run.get('cpu_family', '?')}, model "
            f"{run.get('cpu_model_number', '?')}; {flags}), torch {run.get('torch', '?')}, "
            f"revision {run.get('git_revision', '?')}, {run.get('date', '?')}._")  # fmt: skip


def cell(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:,.4g}" if abs(value) < 1e5 else f"{value:,.0f}"
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value:,}"
    if isinstance(value, dict):
        return ", ".join(f"{key} {cell(inner)}" for key, inner in value.items())
    if isinstance(value, list):
        return json.dumps(value)
    return str(value)


def _scalars_only(value: Any) -> bool:
    return isinstance(value, dict) and bool(value) and not any(
        isinstance(v, dict | list) for v in value.values())


def _alike_groups(objects: dict[str, Any]) -> list[dict[str, dict[str, Any]]]:
    """Objects of scalars with the same keys, two or more of them: each group reads best as one
    table, a row each."""
    groups: dict[frozenset, dict[str, dict[str, Any]]] = {}
    for key, value in objects.items():
        if _scalars_only(value):
            groups.setdefault(frozenset(value), {})[key] = value
    return [group for group in groups.values() if len(group) >= 2]


def table(rows: list[dict[str, Any]]) -> list[str]:
    columns: list[str] = []
    for row in rows:
        columns += [key for key in row if key not in columns]
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(cell(row.get(c, "")) for c in columns) + " |" for row in rows]
    return lines


def section(name: str, value: Any, depth: int) -> list[str]:
    heading = "#" * min(depth, 6) + f" {name}"
    if isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
        return [heading, "", *table(value), ""]
    if isinstance(value, dict):
        scalars = {k: v for k, v in value.items() if not isinstance(v, dict | list)}
        nested = {k: v for k, v in value.items() if isinstance(v, dict | list)}
        lines = [heading, ""]
        if scalars:
            lines += ["| measure | value |", "|---|---|"]
            lines += [f"| {k} | {cell(v)} |" for k, v in scalars.items()]
            lines.append("")
        tabled: set[str] = set()
        for group in _alike_groups(nested):
            lines += [*table([{"": k, **v} for k, v in group.items()]), ""]
            tabled |= set(group)
        for key, inner in nested.items():
            if key not in tabled:
                lines += section(key, inner, depth + 1)
        return lines
    return [heading, "", cell(value), ""]


def report_markdown(path: Path, level: int = 2, keys: Sequence[str] = ()) -> str:
    """The report at ``path`` as Markdown: a heading of ``level`` naming the file, the run's
    line, then its tables under headings one level down (only the top-level ``keys`` when
    given: KeyError naming one the report lacks)."""
    data = json.loads(path.read_text())
    run = data.get("run") if isinstance(data, dict) else None
    if keys:
        missing = [key for key in keys if key not in data]
        if missing:
            raise KeyError(f"{path.name} has no {', '.join(missing)}")
        data = {"run": run, **{key: data[key] for key in keys}}
    lines = ["#" * level + f" `{path.name}`", "", run_line(run), ""]
    if not isinstance(data, dict):
        return "\n".join(lines + section("results", data, level + 1)).rstrip() + "\n"
    settings = {k: v for k, v in data.items() if k != "run" and not isinstance(v, dict | list)}
    if settings:
        lines += ["| setting | value |", "|---|---|"]
        lines += [f"| {k} | {cell(v)} |" for k, v in settings.items()] + [""]
    tabled: set[str] = set()
    for group in _alike_groups({k: v for k, v in data.items() if k != "run"}):
        rows = [{"": key, **value} for key, value in group.items()]  # side by side
        lines += ["#" * (level + 1) + " " + ", ".join(group), "", *table(rows), ""]
        tabled |= set(group)
    for key, value in data.items():
        if key != "run" and key not in settings and key not in tabled:
            lines += section(key, value, level + 1)
    return "\n".join(lines).rstrip() + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("reports", nargs="+", type=Path)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    text = "\n".join(report_markdown(path) for path in args.reports)
    if args.out is None:
        print(text)
    else:
        args.out.write_text(text)
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
