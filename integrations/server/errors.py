"""OpenAI-style error bodies: ``{"error": {"message", "type", "param", "code"}}``.

Every failure a client can cause answers 4xx with this body; the handlers installed by
``install_error_handlers`` turn FastAPI's own errors (malformed JSON, wrong types, unknown
routes) into the same shape.
"""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel
from starlette.exceptions import HTTPException as StarletteHTTPException

logger = logging.getLogger(__name__)

ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
    500: "server_error",
    503: "service_unavailable",
}


ERROR_DESCRIPTIONS = {
    400: "Invalid request: the body, a field or a limit (`param` names it)",
    401: "Missing or wrong API key",
    404: "Unknown model (or nothing pinned, for /v1/cache/unpin)",
    413: "Request body over the server's size limit",
    429: "The server is at capacity; retry later",
    500: "The engine failed this request (the server goes on serving)",
    503: "The server is shutting down, or its engine has stopped",
}


class ErrorBody(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(BaseModel):
    """Every error the server answers: ``{"error": {"message", "type", "param", "code"}}``."""

    error: ErrorBody


def error_responses(*statuses: int) -> dict[int | str, dict]:
    """The OpenAPI ``responses`` entries for a route that can answer ``statuses``."""
    return {status: {"model": ErrorResponse, "description": ERROR_DESCRIPTIONS[status]}
            for status in statuses}


class ApiError(Exception):
    """An error answered to the client with ``status`` and an OpenAI-style body."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        error_type: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.error_type = error_type or ERROR_TYPES.get(status, "invalid_request_error")

    def body(self) -> dict[str, Any]:
        return {
            "error": {
                "message": self.message,
                "type": self.error_type,
                "param": self.param,
                "code": self.code,
            }
        }


def error_response(error: ApiError) -> JSONResponse:
    return JSONResponse(error.body(), status_code=error.status)


def bad_request(message: str, param: str | None = None, code: str | None = None) -> ApiError:
    return ApiError(400, message, param=param, code=code)


class BodyTooLarge(StarletteHTTPException):
    """A request body over the server's limit (413), raised while the body is read: an
    HTTPException, so FastAPI passes it to the handlers instead of calling it a parse error."""

    def __init__(self, limit: int) -> None:
        super().__init__(413, detail=f"the request body is larger than this server's limit "
                                     f"of {limit} bytes")


def body_too_large(limit: int) -> ApiError:
    """413 ``request_too_large`` for a body over ``limit`` bytes."""
    return ApiError(413, str(BodyTooLarge(limit).detail), code="request_too_large")


def _validation_error(exc: RequestValidationError) -> ApiError:
    first = exc.errors()[0] if exc.errors() else {}
    location = [str(part) for part in first.get("loc", ()) if part != "body"]
    if first.get("type") == "json_invalid":
        return bad_request(f"malformed JSON body: {first.get('msg', '')}", code="json_invalid")
    path = ".".join(location)
    message = first.get("msg", "invalid request")
    return bad_request(f"{path}: {message}" if path else message,
                       param=location[0] if location else None, code=first.get("type"))


def install_error_handlers(app: FastAPI) -> None:
    """Answer every error in the OpenAI shape (validation -> 400, unknown route -> 404...)."""

    @app.exception_handler(ApiError)
    async def _api_error(_: Request, exc: ApiError) -> JSONResponse:
        return error_response(exc)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        return error_response(_validation_error(exc))

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = "request_too_large" if isinstance(exc, BodyTooLarge) else None
        return error_response(ApiError(exc.status_code, str(exc.detail), code=code))

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        """A bug, not a client's fault: logged with its traceback, answered in the same
        shape (500) instead of the framework's plain text."""
        logger.error("%s %s failed", request.method, request.url.path, exc_info=exc)
        return error_response(ApiError(500, f"internal error: {exc!r}",
                                       code="internal_error"))
