"""What every route needs: the engine, the served model name, metrics, admission, limits."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated

from fastapi import Depends, Request

from prefixcache.engine.async_llm import AsyncLLM
from prefixcache.integrations.server.admission import Admission
from prefixcache.integrations.server.errors import ApiError
from prefixcache.integrations.server.limits import RequestLimits
from prefixcache.integrations.server.metrics import ServerMetrics

CACHE_SALT_HEADER = "x-cache-salt"


@dataclass
class ServerState:
    """Shared by the routes of one app (``app.state.server``)."""

    engine: AsyncLLM
    model_name: str
    api_key: str | None = None
    max_n: int = 16
    admission: Admission = field(default_factory=lambda: Admission(256))
    metrics: ServerMetrics = field(default_factory=ServerMetrics)
    limits: RequestLimits | None = None  # None: the defaults for the engine's model
    draining: bool = False  # set on shutdown: new requests and /health answer 503
    tool_call_parser: str = "hermes"  # the format of the served model's tool calls

    def __post_init__(self) -> None:
        if self.limits is None:
            self.limits = RequestLimits.for_model(self.max_model_len)

    @property
    def max_model_len(self) -> int:
        return self.engine.llm.max_model_len

    def check_model(self, model: str | None) -> None:
        """404 ``model_not_found`` unless ``model`` is None or the served model's name."""
        if model is not None and model != self.model_name:
            raise ApiError(
                404,
                f"the model {model!r} does not exist; this server serves {self.model_name!r}",
                param="model",
                code="model_not_found",
            )


async def get_state(request: Request) -> ServerState:
    """The app's state (async: FastAPI runs a plain function dependency on a worker thread,
    one hop per request for a lookup)."""
    return request.app.state.server


def resolve_salt(request: Request, body_salt: str | None) -> str | None:
    """The request's cache salt: the ``cache_salt`` field, else the ``X-Cache-Salt`` header.

    Both name the same tenant namespace, under the same rule: a blank salt (empty or only
    whitespace, which HTTP strips from a header anyway) is a 400, as is giving two
    different values."""
    header = request.headers.get(CACHE_SALT_HEADER)
    _check_not_blank(header, "the X-Cache-Salt header")
    _check_not_blank(body_salt, "cache_salt")
    if body_salt is not None and header is not None and header != body_salt:
        raise ApiError(400, "cache_salt and the X-Cache-Salt header disagree",
                       param="cache_salt", code="invalid_cache_salt")
    return body_salt if body_salt is not None else header


def _check_not_blank(salt: str | None, where: str) -> None:
    """400 ``invalid_cache_salt`` if ``salt`` (given as ``where``) is empty or whitespace."""
    if salt is not None and not salt.strip():
        raise ApiError(400, f"{where} is blank: a cache salt must name a tenant",
                       param="cache_salt", code="invalid_cache_salt")


State = Annotated[ServerState, Depends(get_state)]
"""Route parameter type: ``state: State`` injects the app's ``ServerState``."""
