"""The KV-event wire format: ours decodes with vLLM's own struct layout, and vLLM's (current
and legacy all-array layout, int or bytes hashes) decodes with ours."""

# no `from __future__ import annotations`: msgspec resolves the local structs' annotations
from typing import Any

import msgspec
import pytest

from prefixcache import AllBlocksCleared, BlockRemoved, BlockStored
from prefixcache.event_wire import KVEventDecodeError, decode_batch, encode_batch


def vllm_structs(array_like_events: bool) -> dict[str, type]:
    """vLLM's event structs: the batch an array, events tagged maps (or arrays, legacy)."""

    class EventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
        ts: float
        events: list[Any]
        data_parallel_rank: int | None = None

    class KVCacheEvent(msgspec.Struct, array_like=array_like_events, omit_defaults=True,
                       gc=False, tag=True):  # fmt: skip
        pass

    class VllmBlockStored(KVCacheEvent, tag="BlockStored"):
        block_hashes: list[int | bytes]
        parent_block_hash: int | bytes | None
        token_ids: list[int]
        block_size: int
        lora_id: int | None
        medium: str | None
        lora_name: str | None
        extra_keys: list[Any] | None = None
        group_idx: int | None = None

    class VllmBlockRemoved(KVCacheEvent, tag="BlockRemoved"):
        block_hashes: list[int | bytes]
        medium: str | None
        group_idx: int | None = None

    class VllmAllBlocksCleared(KVCacheEvent, tag="AllBlocksCleared"):
        pass

    class KVEventBatch(EventBatch):
        events: list[VllmBlockStored | VllmBlockRemoved | VllmAllBlocksCleared]

    return {"batch": KVEventBatch, "stored": VllmBlockStored, "removed": VllmBlockRemoved,
            "cleared": VllmAllBlocksCleared}  # fmt: skip


EVENTS = [
    BlockStored([2**64 - 1, 7], None, list(range(8)), 4),
    BlockStored([9], 7, [70000, 1, 2, 3], 4),
    BlockRemoved([7, 9]),
    AllBlocksCleared(),
]


def test_vllm_decodes_our_batches() -> None:
    types = vllm_structs(array_like_events=False)
    batch = msgspec.msgpack.decode(encode_batch(EVENTS, 12.5), type=types["batch"])
    assert batch.ts == 12.5 and batch.data_parallel_rank is None
    stored, child, removed, cleared = batch.events
    assert (stored.block_hashes, stored.parent_block_hash, stored.token_ids, stored.block_size) \
        == ([2**64 - 1, 7], None, list(range(8)), 4)  # fmt: skip
    assert (child.parent_block_hash, removed.block_hashes) == (7, [7, 9])
    assert isinstance(cleared, types["cleared"])
    assert decode_batch(encode_batch(EVENTS, 12.5)) == (12.5, EVENTS)


@pytest.mark.parametrize("legacy", [False, True])
def test_we_decode_vllm_batches(legacy: bool) -> None:
    types = vllm_structs(array_like_events=legacy)
    digest = bytes(range(32))
    batch = types["batch"](3.0, [
        types["stored"]([11, 12], None, list(range(32)), 16, None, "GPU", None, group_idx=0),
        types["stored"]([digest], 12, list(range(16)), 16, None, None, None),
        types["stored"]([13], None, list(range(16)), 16, None, "CPU", None),  # offload tier
        types["stored"]([14], None, list(range(16)), 16, None, "GPU", None, group_idx=1),
        types["removed"]([11], "GPU"),
        types["cleared"](),
    ], 0)  # fmt: skip
    ts, events = decode_batch(msgspec.msgpack.encode(batch))
    assert ts == 3.0
    assert events == [
        BlockStored([11, 12], None, list(range(32)), 16),
        BlockStored([digest], 12, list(range(16)), 16),
        BlockRemoved([11]),
        AllBlocksCleared(),
    ]


@pytest.mark.parametrize("payload", [
    b"\xc1", msgspec.msgpack.encode([1.0]), msgspec.msgpack.encode(["x", []]),
    msgspec.msgpack.encode([1.0, [{"type": "Unknown"}]]),
    msgspec.msgpack.encode([1.0, [{"type": "BlockStored", "block_hashes": [1]}]]),
    msgspec.msgpack.encode([1.0, [{"type": "BlockRemoved", "block_hashes": [True]}]]),
    msgspec.msgpack.encode([1.0, [42]]),
])  # fmt: skip
def test_bad_payloads_raise(payload: bytes) -> None:
    with pytest.raises(KVEventDecodeError):
        decode_batch(payload)


def test_encoding_rejects_foreign_objects() -> None:
    with pytest.raises(TypeError):
        encode_batch(["BlockStored"], 0.0)  # type: ignore[list-item]
