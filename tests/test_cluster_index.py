"""ClusterIndex: a precise per-backend prefix index built from cache events equals the caches."""

from __future__ import annotations

import random

import pytest

from prefixcache import AllBlocksCleared, BlockRemoved, BlockStored, PrefixCache
from prefixcache.cluster_index import ClusterIndex

BS = 4


def serve(cache: PrefixCache, tokens: list[int]) -> None:
    """What an engine does with one prompt: reuse its cached prefix, cache the rest."""
    hit = cache.match(tokens)
    need = len(tokens) // BS - len(hit.block_ids)
    fresh = cache.allocate(need) if need > 0 and cache.can_allocate(need) else []
    if fresh or not need:
        cache.insert(tokens, hit.block_ids + fresh)
    cache.release(hit.block_ids + fresh)


def prompts(rng: random.Random, count: int) -> list[list[int]]:
    """Prompts sharing a few system prefixes and conversation histories."""
    roots = [[rng.randrange(50) for _ in range(BS * rng.randrange(1, 4))] for _ in range(4)]
    out = []
    for _ in range(count):
        base = list(rng.choice(roots + out[-5:] if out else roots))
        out.append(base + [rng.randrange(50) for _ in range(rng.randrange(0, 3 * BS))])
    return out


def python_hasher(data: memoryview, seed: int) -> int:
    """A different hash function than the index's own."""
    return hash((bytes(data), seed)) % 2**64


@pytest.mark.parametrize("seed", range(6))
def test_index_from_events_equals_every_cache(seed: int) -> None:
    rng = random.Random(seed)
    caches = {
        "a": PrefixCache(12, BS, enable_events=True),
        "b": PrefixCache(20, BS, enable_events=True, model_fingerprint="other-model"),
        "c": PrefixCache(8, BS, enable_events=True, block_hasher=python_hasher),
    }
    index = ClusterIndex(BS)
    workload = prompts(rng, 60)
    for tokens in workload:
        name = rng.choice(sorted(caches))
        serve(caches[name], tokens)
        index.apply_all(name, caches[name].drain_events())
        index.check_invariants()
        probe = rng.choice(workload)
        found = index.match(index.prompt_hashes(probe))
        for other, cache in caches.items():
            assert found.get(other, 0) * BS == cache.lookup(probe), (other, probe)
    assert index.orphan_blocks == 0


def test_missed_events_leave_orphans_and_clear_forgets_a_backend() -> None:
    cache = PrefixCache(16, BS, enable_events=True)
    index = ClusterIndex(BS)
    serve(cache, list(range(8)))
    cache.drain_events()  # the subscriber missed these
    serve(cache, list(range(12)))
    index.apply_all("a", cache.drain_events())
    assert index.orphan_blocks == 1 and index.match(index.prompt_hashes(range(12))) == {}
    serve(cache, [9] * 8)
    index.apply_all("a", cache.drain_events())
    assert index.match(index.prompt_hashes([9] * 8)) == {"a": 2}
    index.apply("a", AllBlocksCleared())
    assert index.match(index.prompt_hashes([9] * 8)) == {} and index.num_blocks("a") == 0
    index.check_invariants()


def test_replayed_events_are_idempotent_and_removals_count_copies() -> None:
    index = ClusterIndex(BS)
    stored = BlockStored([11, 12], None, list(range(8)), BS)
    index.apply("x", stored)
    index.apply("x", stored)  # a replayed batch
    index.apply("x", BlockStored([21], None, list(range(4)), BS))  # same tokens, other salt
    hashes = index.prompt_hashes(range(8))
    assert index.match(hashes) == {"x": 2}
    index.apply("x", BlockRemoved([12]))
    assert index.match(hashes) == {"x": 1}
    index.apply("x", BlockRemoved([11]))
    assert index.match(hashes) == {"x": 1}  # the salted copy still holds block 0
    index.apply("x", BlockRemoved([21, 999]))
    assert index.match(hashes) == {}
    index.check_invariants()


def test_backends_drop_out_at_their_own_depth() -> None:
    index = ClusterIndex(BS)
    tokens = list(range(16))
    index.apply("one", BlockStored([1], None, tokens[:4], BS))
    index.apply("three", BlockStored([1, 2, 3], None, tokens[:12], BS))
    index.apply("four", BlockStored([5, 6, 7, 8], None, tokens, BS))
    index.apply("other", BlockStored([9], None, [7] * 4, BS))
    assert index.match(index.prompt_hashes(tokens)) == {"one": 1, "three": 3, "four": 4}
    assert index.match(index.prompt_hashes(tokens[:3])) == {}


def test_bad_events_raise_or_are_counted() -> None:
    index = ClusterIndex(BS)
    with pytest.raises(ValueError, match="token ids"):
        index.apply("x", BlockStored([1, 2], None, [0] * 5, BS))
    index.apply("x", BlockStored([1], None, [0] * 8, 8))
    assert index.foreign_block_size_events == 1
    with pytest.raises(TypeError):
        index.apply("x", "BlockStored")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        ClusterIndex(0)
    index.check_invariants()


def test_a_hole_ends_a_backends_run_and_late_holders_do_not_count() -> None:
    """A backend that lost a middle block (its parent evicted before its child) holds only the
    blocks before the hole; one holding a later block but not the first holds nothing; runs of
    blocks with the same holders are matched as one."""
    index = ClusterIndex(BS)
    tokens = list(range(24))
    index.apply("a", BlockStored([1, 2, 3, 4, 5, 6], None, tokens, BS))
    index.apply("b", BlockStored([1, 2, 3, 4], None, tokens[:16], BS))
    index.apply("c", BlockStored([1, 2], None, tokens[:8], BS))
    index.apply("a", BlockRemoved([3]))  # a: blocks 0, 1, 3, 4, 5
    index.apply("c", BlockRemoved([1]))  # c: block 1 only
    hashes = index.prompt_hashes(tokens)
    assert index.match(hashes) == {"a": 2, "b": 4}
    index.apply("b", BlockRemoved([1]))
    assert index.match(hashes) == {"a": 2}
    index.apply("a", BlockRemoved([1]))
    assert index.match(hashes) == {}
    index.check_invariants()
