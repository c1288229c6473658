"""Cache events on the wire, in vLLM's KV-event format (msgpack via msgspec).

A batch is ``[ts, events, data_parallel_rank]`` (an array); each event is a map tagged by
``"type"``: ``BlockStored`` (block_hashes, parent_block_hash, token_ids, block_size, lora_id,
medium, lora_name), ``BlockRemoved`` (block_hashes, medium) or ``AllBlocksCleared``: the layout
vLLM's ``--kv-events-config`` publishes, so a consumer of vLLM's events reads ours unchanged.
The decoder also reads the older all-array layout and hashes sent as bytes.
"""

from __future__ import annotations

from typing import Any

import msgspec

from prefixcache.events import AllBlocksCleared, BlockRemoved, BlockStored, CacheEvent


class _WireBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float
    events: list[Any]
    data_parallel_rank: int | None = None


class _WireEvent(msgspec.Struct, omit_defaults=True, gc=False, tag=True):
    pass


class _WireBlockStored(_WireEvent, tag="BlockStored"):
    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None


class _WireBlockRemoved(_WireEvent, tag="BlockRemoved"):
    block_hashes: list[int]
    medium: str | None


class _WireAllBlocksCleared(_WireEvent, tag="AllBlocksCleared"):
    pass


_ENCODER = msgspec.msgpack.Encoder()
PRIMARY_MEDIA = (None, "GPU")
"""Media an index counts as the backend's pool; other media (vLLM's "CPU" offload tier) are
another tier's events and are skipped."""


class KVEventDecodeError(ValueError):
    """A payload that is not a KV-event batch."""


def encode_batch(events: list[CacheEvent], ts: float, rank: int | None = None) -> bytes:
    """One batch of core events as vLLM's wire bytes."""
    return _ENCODER.encode(_WireBatch(ts, [_to_wire(event) for event in events], rank))


def _to_wire(event: CacheEvent) -> _WireEvent:
    if isinstance(event, BlockStored):
        return _WireBlockStored(
            list(event.block_hashes), event.parent_block_hash, list(event.token_ids),
            event.block_size, lora_id=None, medium=None, lora_name=None,
        )  # fmt: skip
    if isinstance(event, BlockRemoved):
        return _WireBlockRemoved(list(event.block_hashes), None)
    if isinstance(event, AllBlocksCleared):
        return _WireAllBlocksCleared()
    raise TypeError(f"not a cache event: {type(event).__name__}")


def decode_batch(payload: bytes) -> tuple[float, list[CacheEvent]]:
    """``(ts, events)`` of one batch from vLLM or from us; events of a non-primary medium or a
    KV group other than 0 are dropped. Raises KVEventDecodeError for anything else."""
    try:
        raw = msgspec.msgpack.decode(payload)
    except msgspec.DecodeError as error:
        raise KVEventDecodeError(f"not msgpack: {error}") from None
    if isinstance(raw, dict):
        ts, events = raw.get("ts"), raw.get("events")
    elif isinstance(raw, list) and len(raw) >= 2:
        ts, events = raw[0], raw[1]
    else:
        raise KVEventDecodeError("a batch is [ts, events, ...] or a map with ts and events")
    if not isinstance(ts, int | float) or not isinstance(events, list):
        raise KVEventDecodeError("a batch needs a numeric ts and a list of events")
    decoded = [_from_wire(event) for event in events]
    return float(ts), [event for event in decoded if event is not None]


_FIELDS = {
    "BlockStored": ("block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id",
                    "medium", "lora_name", "extra_keys", "group_idx"),
    "BlockRemoved": ("block_hashes", "medium", "group_idx"),
    "AllBlocksCleared": (),
}  # fmt: skip


def _from_wire(event: Any) -> CacheEvent | None:
    if isinstance(event, dict):
        kind, fields = event.get("type"), event
    elif isinstance(event, list) and event and isinstance(event[0], str):
        kind = event[0]
        fields = dict(zip(_FIELDS.get(kind, ()), event[1:], strict=False))
    else:
        raise KVEventDecodeError(f"not a tagged event: {event!r:.80}")
    if kind not in _FIELDS:
        raise KVEventDecodeError(f"unknown event type {kind!r}")
    if kind == "AllBlocksCleared":
        return AllBlocksCleared()
    if fields.get("medium") not in PRIMARY_MEDIA or fields.get("group_idx") not in (None, 0):
        return None
    try:
        hashes = [_hash_key(h) for h in fields["block_hashes"]]
        if kind == "BlockRemoved":
            return BlockRemoved(hashes)
        parent = fields["parent_block_hash"]
        tokens, block_size = fields["token_ids"], fields["block_size"]
        if not isinstance(block_size, int) or not all(isinstance(t, int) for t in tokens):
            raise TypeError("block_size and token_ids must be ints")
        return BlockStored(hashes, None if parent is None else _hash_key(parent), tokens,
                           block_size)  # fmt: skip
    except (KeyError, TypeError) as error:
        raise KVEventDecodeError(f"bad {kind} event: {error}") from None


def _hash_key(value: Any) -> int | bytes:
    """A block hash as sent: a 64-bit int, or the digest's bytes (vLLM's non-int mode)."""
    if isinstance(value, bool) or not isinstance(value, int | bytes):
        raise TypeError(f"a block hash is an int or bytes, got {type(value).__name__}")
    return value
