"""Reference pages generated from the code: the CLI's help (the typer app) and the HTTP API
(the server's OpenAPI schema), as Markdown. The docs build calls these (``docs/hooks``), so the
reference never drifts from the code."""

from __future__ import annotations

from typing import Any

import typer
from fastapi import FastAPI


def cli_reference() -> str:
    """Every ``prefixcache`` subcommand's ``--help``, one section each, in registration order,
    as the terminal shows it 100 columns wide."""
    from typer.testing import CliRunner

    from prefixcache.integrations.cli import app

    group = typer.main.get_command(app)
    runner = CliRunner()
    sections = []
    for name, command in group.commands.items():  # type: ignore[attr-defined]
        result = runner.invoke(app, [name, "--help"], terminal_width=100,
                               env={"COLUMNS": "100", "NO_COLOR": "1", "TERM": "dumb"})  # fmt: skip
        text = "\n".join(line.rstrip() for line in result.output.strip("\n").splitlines())
        summary = (command.help or "").strip().split("\n")[0]
        sections.append(f"## `prefixcache {name}`\n\n{summary}\n\n```text\n{text}\n```\n")
    return "\n".join(sections)


def server_schema() -> dict[str, Any]:
    """The OpenAI server's OpenAPI schema, from its routes alone (no model is loaded)."""
    from prefixcache.integrations.server import routes_cache, routes_info, routes_openai
    from prefixcache.integrations.server.app import OPEN_PATHS
    from prefixcache.integrations.server.openapi_contract import contract_openapi

    app = FastAPI(title="prefixcache", version="0.1.0")
    for module in (routes_openai, routes_info, routes_cache):
        app.include_router(module.router)
    return contract_openapi(app, OPEN_PATHS, requires_key=False,
                            stream_chunks=routes_openai.STREAM_CHUNKS)()  # fmt: skip


def http_reference() -> str:
    """Each route: its method and path, what it does, its request fields and its statuses."""
    schema = server_schema()
    components = schema.get("components", {}).get("schemas", {})
    sections = []
    for path, operations in schema.get("paths", {}).items():
        for method, operation in operations.items():
            lines = [f"## `{method.upper()} {path}`", ""]
            description = operation.get("description") or operation.get("summary") or ""
            if description:
                lines += [description.strip(), ""]
            body = operation.get("requestBody", {}).get("content", {})
            reference = body.get("application/json", {}).get("schema", {}).get("$ref")
            if reference:
                lines += _fields_table(components.get(reference.rsplit("/", 1)[-1], {}))
            statuses = ", ".join(f"{code} ({response.get('description', '').strip()})"
                                 for code, response in operation.get("responses", {}).items())
            lines += [f"Responses: {statuses}.", ""]
            sections.append("\n".join(lines))
    return "\n".join(sections)


def _fields_table(model: dict[str, Any]) -> list[str]:
    properties = model.get("properties", {})
    if not properties:
        return []
    required = set(model.get("required", []))
    rows = ["| field | type | default |", "|---|---|---|"]
    for name, field in properties.items():
        default = "required" if name in required else f"`{field.get('default')!r}`"
        rows.append(f"| `{name}` | {_type_name(field)} | {default} |")
    return [*rows, ""]


def _type_name(field: dict[str, Any]) -> str:
    if "$ref" in field:
        return field["$ref"].rsplit("/", 1)[-1]
    for key in ("anyOf", "oneOf"):
        if key in field:
            return " or ".join(_type_name(option) for option in field[key])
    kind = field.get("type", "any")
    if kind == "array":
        return f"list of {_type_name(field.get('items', {}))}"
    if "enum" in field:
        return " / ".join(f"`{value}`" for value in field["enum"])
    return str(kind)
