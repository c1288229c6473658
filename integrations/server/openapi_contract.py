"""``/openapi.json`` as the server's contract: what each route can answer, and nothing else.

FastAPI documents a 422 validation error on every route with a body; this server answers
such input 400 in the OpenAI error shape (``errors.install_error_handlers``), so the 422
entries and their schemas are dropped. Every error status is JSON (``ErrorResponse``) on every
route, whatever a route's own media type (``/metrics`` is text). Where an API key is required,
every route but ``/health`` can answer 401, and says so.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel

from prefixcache.integrations.server.errors import error_responses

FASTAPI_VALIDATION_SCHEMAS = ("HTTPValidationError", "ValidationError")
ERROR_REF = {"$ref": "#/components/schemas/ErrorResponse"}
SCHEMAS = "#/components/schemas/{model}"


def sse_events(chunk: type[BaseModel]) -> dict[str, Any]:
    """The schema of one event of a generation stream (OpenAPI 3.1: a ``text/event-stream``
    ``schema`` describes each event): ``data`` is a ``chunk`` as JSON, an error body (the
    last event before ``[DONE]`` when the request fails mid-stream), or ``[DONE]``."""
    return {
        "type": "object", "required": ["data"],
        "properties": {"data": {"anyOf": [
            {"const": "[DONE]"},
            {"type": "string", "contentMediaType": "application/json", "contentSchema": {
                "anyOf": [{"$ref": SCHEMAS.format(model=chunk.__name__)}, ERROR_REF]}},
        ]}},
    }


def _add_model(components: dict[str, Any], model: type[BaseModel]) -> None:
    """``model``'s JSON schema (and those it refers to) under ``components``."""
    schema = model.model_json_schema(ref_template=SCHEMAS)
    for name, definition in schema.pop("$defs", {}).items():
        components.setdefault(name, definition)
    components.setdefault(model.__name__, schema)


def contract_openapi(app: FastAPI, open_paths: frozenset[str], requires_key: bool,
                     stream_chunks: tuple[type[BaseModel], ...]) -> Callable[[], dict[str, Any]]:
    """A replacement for ``app.openapi``: the generated schema without FastAPI's 422s, with
    401 on every operation outside ``open_paths`` when ``requires_key``, and the models of
    ``stream_chunks`` (named by ``sse_events``) among its components; built once."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = get_openapi(title=app.title, version=app.version, routes=app.routes)
            unauthorized = error_responses(401)[401]["description"]
            for path, operations in schema.get("paths", {}).items():
                for operation in operations.values():
                    responses = operation.setdefault("responses", {})
                    responses.pop("422", None)
                    if requires_key and path not in open_paths:
                        responses["401"] = {"description": unauthorized}
                    for status, response in responses.items():
                        if int(status) >= 400:
                            response["content"] = {"application/json": {"schema": ERROR_REF}}
            components = schema.setdefault("components", {}).setdefault("schemas", {})
            for name in FASTAPI_VALIDATION_SCHEMAS:
                components.pop(name, None)
            for model in stream_chunks:
                _add_model(components, model)
            app.openapi_schema = schema
        return app.openapi_schema

    return openapi
