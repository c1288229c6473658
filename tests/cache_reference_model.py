"""A naive reference model of the PrefixCache contract.

The model keeps the cache as a plain dict ``{(salt, prefix tokens): block_id}`` plus ref
counts, a multiset of pins and the counters of ``stats()``. Every operation takes the
arguments of the call and a ``run`` callable that performs the same call on the real cache:
the model predicts the outcome, runs the call, checks what came back and updates itself.

What the model cannot predict is *which* evictable blocks the implementation evicts (that
depends on LRU details) nor which free blocks it hands out. For those it checks that the
choice was legal (only evictable blocks, leaves first, exactly as many as needed) and adopts
it. With ``exact=False`` (weak block hashers) it also accepts the misses a hash collision may
cost: shorter matches and fewer newly cached blocks, never a wrong block.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pytest

TOKEN_LIMIT = 2**31

Key = tuple[str | None, tuple[int, ...]]
"""(salt, token prefix) identifying one cached block: the prefix ends with that block."""


def normalize_tokens(token_ids: object) -> tuple[int, ...]:
    """Validate token ids as the contract demands; return them as a tuple of ints."""
    if isinstance(token_ids, np.ndarray):
        if token_ids.ndim != 1 or token_ids.dtype not in (np.int32, np.int64):
            raise TypeError("token_ids must be a 1-D int32/int64 array")
        values = [int(v) for v in token_ids]
    elif isinstance(token_ids, list):
        for v in token_ids:
            if isinstance(v, bool) or not isinstance(v, int):
                raise TypeError("token ids must be ints")
        values = list(token_ids)
    else:
        raise TypeError("token_ids must be a list or a numpy array")
    for v in values:
        if v < 0 or v >= TOKEN_LIMIT:
            raise ValueError("token id out of range")
    return tuple(values)


def validate_salt(salt: object) -> str | None:
    """Salts are None or str."""
    if salt is not None and not isinstance(salt, str):
        raise TypeError("salt must be None or str")
    return salt


def expect_error(error: type[BaseException], run: Callable[[], Any]) -> None:
    """Run a call that must raise exactly ``error`` (or a subclass)."""
    with pytest.raises(error):
        run()


class ReferenceCache:
    """Executable specification of PrefixCache, compared call by call with the real one."""

    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        *,
        exact: bool = True,
        cache_full: type = Exception,
        predict_order: bool = False,
    ) -> None:
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.exact = exact
        self.cache_full = cache_full
        self.predict_order = predict_order
        # Per cached key: (priority, recency stamp of the last match/insert covering it).
        self.clock = 0
        self.stamp: dict[Key, int] = {}
        self.priority_of: dict[Key, int] = {}
        self.refs: list[int] = [0] * num_blocks
        self.cached: dict[Key, int] = {}
        self.key_of: dict[int, Key] = {}
        self.pins: Counter[Key] = Counter()
        self.query_tokens = 0
        self.hit_tokens = 0
        self.evictions = 0
        self.recently_evicted: list[Key] = []

    # ------------------------------------------------------------------ queries
    def keys_for(self, tokens: Sequence[int], salt: str | None) -> list[Key]:
        """One key per full block of ``tokens``."""
        bs = self.block_size
        return [(salt, tuple(tokens[: (i + 1) * bs])) for i in range(len(tokens) // bs)]

    def cached_path(self, tokens: Sequence[int], salt: str | None) -> list[int]:
        """Block ids of the longest cached full-block prefix of ``tokens``."""
        path: list[int] = []
        for key in self.keys_for(tokens, salt):
            block = self.cached.get(key)
            if block is None:
                break
            path.append(block)
        return path

    def free_blocks(self) -> set[int]:
        """Blocks with ref 0 that are not cached."""
        return {b for b in range(self.num_blocks) if self.refs[b] == 0 and b not in self.key_of}

    def protected_keys(self) -> set[Key]:
        """Keys on the path of some pinned prefix."""
        bs = self.block_size
        protected: set[Key] = set()
        for (salt, tokens), count in self.pins.items():
            assert count > 0
            for end in range(bs, len(tokens) + 1, bs):
                protected.add((salt, tokens[:end]))
        return protected

    def children(self) -> dict[Key, list[Key]]:
        """Cached child keys of each cached key."""
        kids: dict[Key, list[Key]] = defaultdict(list)
        for salt, tokens in self.cached:
            if len(tokens) > self.block_size:
                kids[(salt, tokens[: -self.block_size])].append((salt, tokens))
        return kids

    def evictable_blocks(self) -> set[int]:
        """Cached, ref 0, unpinned blocks whose whole cached subtree is the same."""
        protected = self.protected_keys()
        kids = self.children()
        memo: dict[Key, bool] = {}

        def ok(key: Key) -> bool:
            if key not in memo:
                memo[key] = (
                    self.refs[self.cached[key]] == 0
                    and key not in protected
                    and all(ok(child) for child in kids.get(key, ()))
                )
            return memo[key]

        return {self.cached[key] for key in self.cached if ok(key)}

    def leaf_keys(self) -> list[Key]:
        """Cached keys without a cached child."""
        kids = self.children()
        return [key for key in self.cached if not kids.get(key)]

    def eviction_order(self, n: int) -> list[int]:
        """The first ``n`` blocks the policy evicts: evictable leaves peeled lowest
        (priority, recency) first. Only meaningful when no two candidates tie."""
        evictable = {self.key_of[b] for b in self.evictable_blocks()}
        remaining = set(self.cached)
        order: list[int] = []
        for _ in range(n):
            leaves = [key for key in evictable if not self._has_child(key, remaining)]
            assert leaves, "no evictable leaf left"
            victim = min(leaves, key=lambda k: (self.priority_of[k], self.stamp[k]))
            order.append(self.cached[victim])
            evictable.remove(victim)
            remaining.remove(victim)
        return order

    def _has_child(self, key: Key, remaining: set[Key]) -> bool:
        """Whether some key in ``remaining`` extends ``key`` by one block."""
        salt, tokens = key
        depth = len(tokens) + self.block_size
        return any(
            s == salt and len(t) == depth and t[: len(tokens)] == tokens for s, t in remaining
        )

    def touch(self, keys: Sequence[Key]) -> None:
        """A match or insert covered ``keys``: they become the most recently used."""
        self.clock += 1
        for key in keys:
            self.stamp[key] = self.clock

    def stats(self) -> dict[str, int]:
        """The stats() counters the contract fixes."""
        in_use = sum(1 for r in self.refs if r > 0)
        cached = sum(1 for b in self.key_of if self.refs[b] == 0)
        return {
            "num_blocks": self.num_blocks,
            "block_size": self.block_size,
            "free": self.num_blocks - in_use - cached,
            "in_use": in_use,
            "cached": cached,
            "query_tokens": self.query_tokens,
            "hit_tokens": self.hit_tokens,
            "evictions": self.evictions,
        }

    def check_self(self) -> None:
        """Internal consistency of the model (prefix-closed, bijective block map)."""
        assert len(self.key_of) == len(self.cached)
        for key, block in self.cached.items():
            assert self.key_of[block] == key
            salt, tokens = key
            assert len(tokens) % self.block_size == 0 and tokens
            if len(tokens) > self.block_size:
                assert (salt, tokens[: -self.block_size]) in self.cached, "not prefix-closed"
        for key in self.pins:
            assert key in self.cached, "pinned prefix left the cache"

    # ------------------------------------------------------------- adoption
    def _is_block_id(self, block: object) -> bool:
        return (
            isinstance(block, int) and not isinstance(block, bool) and 0 <= block < self.num_blocks
        )

    def _can_allocate(self, n: int) -> bool:
        free = len(self.free_blocks())
        return n <= free or n - free <= len(self.evictable_blocks())

    def _adopt_allocation(self, n: int, ids: list[int]) -> None:
        """Check a legal allocation of ``n`` blocks, evicting as observed, and apply it."""
        assert isinstance(ids, list), f"allocate must return a list, got {type(ids)}"
        assert len(ids) == n, f"asked for {n} blocks, got {ids}"
        assert all(self._is_block_id(b) for b in ids), f"invalid block ids {ids}"
        assert len(set(ids)) == n, f"duplicate block ids {ids}"
        free = self.free_blocks()
        got = set(ids)
        if n <= len(free):
            assert got <= free, f"evicted {sorted(got - free)} while {len(free)} blocks were free"
        else:
            assert free <= got, f"free blocks {sorted(free - got)} not taken first"
            if self.predict_order:
                expected = set(self.eviction_order(n - len(free)))
                assert got - free == expected, (
                    f"evicted {sorted(got - free)}, policy order says {sorted(expected)}"
                )
            self._adopt_evictions(got - free)
        for b in ids:
            assert self.refs[b] == 0
            self.refs[b] = 1

    def _adopt_evictions(self, evicted: set[int]) -> None:
        """Check that evicting ``evicted`` is legal and remove those blocks from the model."""
        evictable = self.evictable_blocks()
        illegal = evicted - evictable
        assert not illegal, (
            f"evicted non-evictable blocks {sorted(illegal)} "
            f"(keys {[self.key_of.get(b) for b in sorted(illegal)]}, "
            f"refs {[self.refs[b] for b in sorted(illegal)]})"
        )
        for b in evicted:
            key = self.key_of.pop(b)
            del self.cached[key]
            self.stamp.pop(key, None)
            self.priority_of.pop(key, None)
            self.recently_evicted.append(key)
        for salt, tokens in self.cached:
            if len(tokens) > self.block_size:
                parent = (salt, tokens[: -self.block_size])
                assert parent in self.cached, f"evicted {parent} before its child"
        self.evictions += len(evicted)

    # ----------------------------------------------------------- operations
    def match(
        self,
        token_ids: object,
        salt: object,
        max_tokens: int | None,
        run: Callable[[], Any],
    ) -> Any:
        """match(): longest cached prefix, +1 ref on each matched block."""
        try:
            tokens = normalize_tokens(token_ids)
            salt = validate_salt(salt)
        except (TypeError, ValueError) as exc:
            expect_error(type(exc), run)
            return None
        query = tokens if max_tokens is None else tokens[:max_tokens]
        path = self.cached_path(query, salt)
        result = run()
        got = list(result.block_ids)
        assert result.num_tokens == len(got) * self.block_size, result
        if self.exact:
            assert got == path, f"match({query}, salt={salt!r}) gave {got}, expected {path}"
        else:
            assert got == path[: len(got)], f"matched wrong blocks {got}, cached path {path}"
        for b in got:
            self.refs[b] += 1
        if got:
            self.touch(self.keys_for(query, salt)[: len(got)])
        self.query_tokens += len(tokens)
        self.hit_tokens += result.num_tokens
        return result

    def lookup(self, token_ids: object, salt: object, run: Callable[[], Any]) -> int | None:
        """lookup(): length of the longest cached prefix, no side effect."""
        try:
            tokens = normalize_tokens(token_ids)
            salt = validate_salt(salt)
        except (TypeError, ValueError) as exc:
            expect_error(type(exc), run)
            return None
        expected = len(self.cached_path(tokens, salt)) * self.block_size
        got = run()
        assert isinstance(got, int), got
        if self.exact:
            assert got == expected, f"lookup({tokens}, salt={salt!r}) = {got}, expected {expected}"
        else:
            assert 0 <= got <= expected and got % self.block_size == 0, (got, expected)
        return got

    def block_hashes(self, token_ids: object, salt: object, run: Callable[[], Any]) -> Any:
        """block_hashes(): one 64-bit int per full block (values not predicted)."""
        try:
            tokens = normalize_tokens(token_ids)
            validate_salt(salt)
        except (TypeError, ValueError) as exc:
            expect_error(type(exc), run)
            return None
        hashes = run()
        assert len(hashes) == len(tokens) // self.block_size
        assert all(isinstance(h, int) and 0 <= h < 2**64 for h in hashes), hashes
        return hashes

    def allocate(self, n: object, run: Callable[[], Any]) -> list[int] | None:
        """allocate(n): free blocks first, then legal evictions; CacheFull changes nothing."""
        if isinstance(n, bool) or not isinstance(n, int):
            expect_error(TypeError, run)
            return None
        if n < 0:
            expect_error(ValueError, run)
            return None
        if not self._can_allocate(n):
            expect_error(self.cache_full, run)
            return None
        ids = run()
        self._adopt_allocation(n, ids)
        return ids

    def _insert_error(
        self, tokens: tuple[int, ...], block_ids: Sequence[object], salt: str | None
    ) -> tuple[int | None, int]:
        """(index of the first bad newly cached position or None, first uncached index)."""
        keys = self.keys_for(tokens, salt)
        start = len(self.cached_path(tokens, salt))
        seen: set[object] = set()
        for i in range(start, len(keys)):
            block = block_ids[i]
            assert isinstance(block, int)
            if self.refs[block] == 0 or block in self.key_of or block in seen:
                return i, start
            seen.add(block)
        return None, start

    def insert(
        self,
        token_ids: object,
        block_ids: Sequence[object],
        salt: object,
        priority: int,
        run: Callable[[], Any],
    ) -> int | None:
        """insert(): cache the caller's blocks for uncached full-block prefixes."""
        try:
            tokens = normalize_tokens(token_ids)
            salt = validate_salt(salt)
        except (TypeError, ValueError) as exc:
            expect_error(type(exc), run)
            return None
        full = len(tokens) // self.block_size
        if len(block_ids) < full or not all(self._is_block_id(b) for b in block_ids[:full]):
            expect_error(ValueError, run)
            return None
        bad, start = self._insert_error(tokens, block_ids, salt)
        keys = self.keys_for(tokens, salt)
        if bad is not None and self.exact:
            expect_error(ValueError, run)
            return None
        if bad is not None:
            # A weak hasher may stop the insert (a miss) before it reaches the bad block.
            try:
                newly = run()
            except ValueError:
                return None
            assert 0 <= newly <= bad - start, (newly, bad, start)
        else:
            newly = run()
            assert isinstance(newly, int), newly
            if self.exact:
                assert newly == full - start, f"insert cached {newly}, expected {full - start}"
            else:
                assert 0 <= newly <= full - start, (newly, full, start)
        for i in range(start, start + newly):
            block = block_ids[i]
            assert isinstance(block, int)
            self.cached[keys[i]] = block
            self.key_of[block] = keys[i]
            self.priority_of[keys[i]] = priority
        if keys:
            self.touch(keys[: start + newly])
        return newly

    def release(self, block_ids: Sequence[object], run: Callable[[], Any]) -> bool:
        """release(): -1 ref each, all or nothing."""
        if not all(self._is_block_id(b) for b in block_ids):
            expect_error(ValueError, run)
            return False
        counts = Counter(block_ids)
        if any(self.refs[b] < c for b, c in counts.items()):  # type: ignore[index]
            expect_error(ValueError, run)
            return False
        run()
        for b, c in counts.items():
            self.refs[b] -= c  # type: ignore[index]
        return True

    def fork(self, block_ids: Sequence[object], run: Callable[[], Any]) -> bool:
        """fork(): +1 ref each, every block must be in use."""
        if not all(self._is_block_id(b) and self.refs[b] > 0 for b in block_ids):  # type: ignore[index]
            expect_error(ValueError, run)
            return False
        run()
        for b in block_ids:
            self.refs[b] += 1  # type: ignore[index]
        return True

    def copy_on_write(self, block_id: object, run: Callable[[], Any]) -> tuple[int, Any] | None:
        """copy_on_write(): private uncached blocks stay, others are copied."""
        if not self._is_block_id(block_id) or self.refs[block_id] == 0:  # type: ignore[index]
            expect_error(ValueError, run)
            return None
        assert isinstance(block_id, int)
        must_copy = self.refs[block_id] > 1 or block_id in self.key_of
        if must_copy and not self._can_allocate(1):
            expect_error(self.cache_full, run)
            return None
        new_id, op = run()
        if not must_copy:
            assert (new_id, op) == (block_id, None), (new_id, op)
            return new_id, op
        assert new_id != block_id
        assert op is not None and (op.src, op.dst) == (block_id, new_id), op
        self._adopt_allocation(1, [new_id])
        self.refs[block_id] -= 1
        return new_id, op

    def pin(self, token_ids: object, salt: object, run: Callable[[], Any]) -> int | None:
        """pin(): pin the currently cached prefix, return its length."""
        try:
            tokens = normalize_tokens(token_ids)
            salt = validate_salt(salt)
        except (TypeError, ValueError) as exc:
            expect_error(type(exc), run)
            return None
        expected = len(self.cached_path(tokens, salt)) * self.block_size
        got = run()
        if self.exact:
            assert got == expected, f"pin returned {got}, expected {expected}"
        else:
            assert 0 <= got <= expected and got % self.block_size == 0, (got, expected)
        if got:
            self.pins[(salt, tokens[:got])] += 1
        return got

    def deepest_pin(self, tokens: tuple[int, ...], salt: str | None) -> Key | None:
        """The longest pinned prefix of ``tokens`` in the salt's namespace."""
        best: Key | None = None
        for key in self.pins:
            on_path = key[0] == salt and tokens[: len(key[1])] == key[1]
            if on_path and (best is None or len(key[1]) > len(best[1])):
                best = key
        return best

    def unpin(self, token_ids: object, salt: object, run: Callable[[], Any]) -> bool:
        """unpin(): release the deepest pin along the path of token_ids."""
        try:
            tokens = normalize_tokens(token_ids)
            salt = validate_salt(salt)
        except (TypeError, ValueError) as exc:
            expect_error(type(exc), run)
            return False
        key = self.deepest_pin(tokens, salt)
        if key is None:
            expect_error(ValueError, run)
            return False
        run()
        self.pins[key] -= 1
        if not self.pins[key]:
            del self.pins[key]
        return True

    def reset(self, run: Callable[[], Any]) -> int:
        """reset(): evict every evictable block."""
        evictable = self.evictable_blocks()
        got = run()
        assert got == len(evictable), f"reset evicted {got}, expected {len(evictable)}"
        self._adopt_evictions(evictable)
        return got


# ---------------------------------------------------------------- helpers for targeted tests
def cache_prompt(
    cache: Any, tokens: Sequence[int], salt: str | None = None, priority: int = 0
) -> list[int]:
    """One finished request: match, allocate the rest, insert, release.

    Returns the ids of the blocks now caching the prompt's leading full blocks (all of them
    unless a hash collision cost a miss).
    """
    bs = cache.stats()["block_size"]
    m = cache.match(list(tokens), salt=salt)
    need = -(-len(tokens) // bs) - len(m.block_ids)
    blocks = list(m.block_ids) + cache.allocate(need)
    newly = cache.insert(list(tokens), blocks, salt=salt, priority=priority)
    cache.release(blocks)
    return blocks[: len(m.block_ids) + newly]


def snapshot(cache: Any, prompts: Sequence[tuple[Sequence[int], str | None]]) -> tuple[Any, ...]:
    """Observable state without side effects: stats and the cached length of some prompts."""
    lengths = tuple(cache.lookup(list(t), salt=s) for t, s in prompts)
    return tuple(sorted(cache.stats().items())), lengths


def internal_state(cache: Any) -> tuple[Any, ...]:
    """Everything inside a PrefixCache that a failed call must leave alone: reference counts,
    the free list, every node (blocks, key, parent, priority, recency, pins), the roots, the
    eviction index, the block tables of cached blocks, the counters, clock and pending events.
    Reads only; ``snapshot`` is the black-box counterpart."""
    tree = cache.tree
    nodes = tuple(
        None
        if node is None
        else (
            node.idx,
            None if node.parent is None else node.parent.idx,
            node.key,
            tuple(node.block_ids.tolist()),
            node.priority,
            node.last_access,
            node.pin_count,
            node.index_key,
        )
        for node in tree.nodes
    )
    cached = tree.node_of >= 0
    return (
        cache.pool.ref.tolist(),
        cache.pool.free_block_ids().tolist(),
        nodes,
        sorted((repr(name), root.idx) for name, root in tree.roots.items()),
        cache.index.keys(),
        tree.node_of.tolist(),
        tree.tokens[cached].tolist(),
        tree.hashes[cached].tolist(),
        tuple(sorted(cache.stats().items())),
        cache._clock,
        len(cache._events),
    )
