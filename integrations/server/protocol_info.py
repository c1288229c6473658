"""Response bodies of the routes beside the OpenAI ones: health, models, tokenize, cache control.

They are the schema ``/openapi.json`` publishes (the routes answer exactly these shapes), so a
client generated from it, or a contract test, sees what the server sends.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict


class HealthResponse(BaseModel):
    status: Literal["ok"] = "ok"


class KVEventsInfo(BaseModel):
    """Where this server publishes its cache events (``serve --kv-events``)."""

    endpoint: str
    replay_endpoint: str | None
    topic: str
    block_size: int
    format: Literal["vllm-kv-events"] = "vllm-kv-events"


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str
    max_model_len: int


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class TokenizeResponse(BaseModel):
    tokens: list[int]
    count: int
    max_model_len: int


class DetokenizeResponse(BaseModel):
    prompt: str


class WarmResponse(BaseModel):
    prompt_tokens: int
    cached_tokens: int
    pinned: bool


class PinResponse(BaseModel):
    prompt_tokens: int
    pinned_tokens: int


class UnpinResponse(BaseModel):
    prompt_tokens: int
    unpinned: Literal[True] = True


class LookupResponse(BaseModel):
    prompt_tokens: int
    cached_tokens: int


class ResetResponse(BaseModel):
    evicted_blocks: int


class CacheStats(BaseModel):
    """Cache and scheduler counters (``free + in_use + cached == num_blocks``); later
    releases may add keys."""

    model_config = ConfigDict(extra="allow")
    num_blocks: int
    block_size: int
    free: int
    in_use: int
    cached: int
    cached_blocks_total: int
    usage: float
    query_tokens: int
    hit_tokens: int
    hit_rate: float
    evictions: int
    blocks_stored: int
    blocks_removed: int
    nodes: int
    pinned_nodes: int
    pinned_blocks: int
    preemptions: int
    running: int
    waiting: int
    finished_requests: int
    request_errors: int
    failed_steps: int
