"""PrefixCache: the public face of the core — match, allocate, insert, release, fork, CoW, pin.

It composes a ``BlockPool`` (reference counts, free list), a ``RadixTree`` (what is cached) and
an ``EvictionIndex`` (what goes first). Blocks move free -> in use (ref > 0) -> cached (ref 0,
still in the tree, evictable) -> free; ``free + in_use + cached == num_blocks`` always.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np

from prefixcache.block_pool import BlockPool
from prefixcache.cache_invariants import check_cache_invariants
from prefixcache.errors import CacheFull
from prefixcache.events import BlockRemoved, BlockStored, CacheEvent
from prefixcache.eviction_index import EvictionIndex
from prefixcache.hashing import BlockHasher, chain_block_hashes, xxh3_block_hasher
from prefixcache.host_tier import HostTierIndex, LowerTier, PersistBlock, TierCopy
from prefixcache.radix_node import RadixNode
from prefixcache.radix_tree import NamespaceName, PathMatch, RadixTree
from prefixcache.tier_moves import LowerTierLookup, find_in_lower_tier, offer_evicted
from prefixcache.tier_moves import promote as promote_from_tier
from prefixcache.tokens import (
    ExtraKey,
    TokenIds,
    as_block_id,
    as_block_ids,
    as_token_array,
    canonical_extra_keys,
    check_block_count,
    check_max_tokens,
    check_priority,
    check_salt,
)

EVICTION_POLICIES = ("lru",)


class PrefixMatch(NamedTuple):
    """A cache hit: ``block_ids`` hold the first ``num_tokens`` tokens (full blocks only).

    With ``match(partial_block=True)``, ``partial_block`` may name a cached block whose first
    ``partial_tokens`` tokens (fewer than a block) are the next tokens of the prompt: copy it
    into a block of the request's own (it is shared and immutable), then release it.
    """

    block_ids: list[int]
    num_tokens: int
    partial_block: int | None = None
    partial_tokens: int = 0


class CopyOp(NamedTuple):
    """Copy physical block ``src`` into ``dst`` before the step that writes into ``dst``: the
    whole block, or with ``num_tokens`` only its first ``num_tokens`` token slots (the rest of
    ``dst`` is written by the step itself, as after a partial-block hit)."""

    src: int
    dst: int
    num_tokens: int | None = None


class PrefixCache:
    """A ref-counted, copy-on-write pool of KV blocks whose full blocks are found again by prefix
    (and, with ``insert_partial`` / ``match(partial_block=True)``, the partial block after them).

    Every method validates its input and either succeeds or raises with nothing changed.
    """

    def __init__(
        self,
        num_blocks: int,
        block_size: int = 16,
        eviction: str = "lru",
        model_fingerprint: str = "",
        enable_events: bool = False,
        block_hasher: BlockHasher | None = None,
        host_tier_blocks: int = 0,
    ) -> None:
        """``host_tier_blocks`` > 0 adds a host-memory tier of that many blocks under the pool
        (``prefixcache.tier_moves``): evicted full blocks are written back to it and found again
        by ``promote``; the engine carries out the copies ``take_tier_copies`` hands out."""
        if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 1:
            raise ValueError(f"block_size must be a positive int, got {block_size!r}")
        if eviction not in EVICTION_POLICIES:
            raise ValueError(
                f"unknown eviction policy {eviction!r}; choose from {EVICTION_POLICIES}"
            )
        self.block_size = block_size
        self.eviction = eviction
        self.pool = BlockPool(num_blocks)
        self.tree = RadixTree(
            num_blocks,
            block_size,
            xxh3_block_hasher if block_hasher is None else block_hasher,
            model_fingerprint,
        )
        self.index = EvictionIndex()
        self.enable_events = enable_events
        self._events: list[CacheEvent] = []
        self._event_listener: Callable[[CacheEvent], None] | None = None
        self._clock = 0
        self.query_tokens = 0
        self.hit_tokens = 0
        self.evictions = 0
        self.blocks_stored = 0
        self.blocks_removed = 0
        self._pinned: set[RadixNode] = set()  # nodes with pin_count > 0
        self.host_tier = HostTierIndex(host_tier_blocks, block_size) if host_tier_blocks else None
        self._tier_writebacks: list[TierCopy] = []  # (pool block -> tier slot), to copy first
        self._tier_loads: list[TierCopy] = []  # (tier slot -> pool block), then these
        self.tier_hit_blocks = 0
        self.lower_tier: LowerTier | None = None  # set_lower_tier
        self._persist: list[PersistBlock] = []  # newly cached blocks for the lower tier
        self._disk_loads: list[tuple[int, bytes]] = []  # (pool block, payload) to write
        self.lower_tier_hit_blocks = 0

    @property
    def num_blocks(self) -> int:
        return self.pool.num_blocks

    @property
    def num_pinned_nodes(self) -> int:
        return len(self._pinned)

    @property
    def num_pinned_blocks(self) -> int:
        """Blocks no eviction can free while the pins stand: those of every pinned node and of
        the nodes above it (a pin keeps its whole path)."""
        kept: set[RadixNode] = set()
        for node in self._pinned:
            while node is not None and not node.is_root and node not in kept:
                kept.add(node)
                node = node.parent
        return sum(len(node.block_ids) for node in kept)

    # ------------------------------------------------------------------ prefix lookups
    def match(
        self,
        token_ids: TokenIds,
        salt: str | None = None,
        max_tokens: int | None = None,
        extra_keys: Sequence[ExtraKey] = (),
        partial_block: bool = False,
        count: bool = True,
    ) -> PrefixMatch:
        """Longest cached prefix of ``token_ids[:max_tokens]`` in full blocks, and with
        ``partial_block`` the cached block after them that shares the most next tokens.

        Takes one reference on each matched block, the partial one included (release them
        when done), and refreshes the recency of every block used, the partial one included.
        Counts ``query_tokens`` (the whole prompt) and ``hit_tokens`` (the partial block's
        shared tokens too), unless ``count`` is False: a caller that may give the match back
        (an admission the pool cannot hold yet) counts what it uses with ``count_query``.
        ``max_tokens`` is None or an int >= 0 (numpy integers too); ``extra_keys`` as in
        ``canonical_extra_keys``. Bad input raises before any change.
        """
        tokens = as_token_array(token_ids)
        limit = _token_limit(tokens, check_max_tokens(max_tokens))
        path = self._walk(tokens, salt, extra_keys, limit)
        if count:
            self.query_tokens += len(tokens)
        partial = None
        if partial_block:
            partial = self.tree.partial_next(
                self._namespace(salt, extra_keys), path, tokens, limit
            )
        if not path.num_blocks and partial is None:
            return PrefixMatch([], 0)
        ids = path.block_ids()
        self.pool.acquire_unique(ids)
        self._touch(path)
        num_tokens = path.num_blocks * self.block_size
        if partial is None:
            self.hit_tokens += num_tokens if count else 0
            return PrefixMatch(ids.tolist(), num_tokens)
        block, shared = partial
        self.pool.acquire_unique(np.array([block], dtype=np.int32))
        self._touch_block(block)
        self.hit_tokens += num_tokens + shared if count else 0
        return PrefixMatch(ids.tolist(), num_tokens, block, shared)

    def count_query(self, query_tokens: int, hit_tokens: int) -> None:
        """Add a query of ``query_tokens`` tokens, ``hit_tokens`` of them found cached, to the
        hit-rate counters (for matches made with ``count=False``)."""
        for name, value in (("query_tokens", query_tokens), ("hit_tokens", hit_tokens)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{name} must be an int >= 0, got {value!r}")
        if hit_tokens > query_tokens:
            raise ValueError(f"hit_tokens ({hit_tokens}) exceed query_tokens ({query_tokens})")
        self.query_tokens += query_tokens
        self.hit_tokens += hit_tokens

    def lookup(
        self,
        token_ids: TokenIds,
        salt: str | None = None,
        extra_keys: Sequence[ExtraKey] = (),
        partial_block: bool = False,
    ) -> int:
        """Cached prefix length in tokens (full blocks; with ``partial_block`` also the tokens
        a cached block after them shares); takes no reference, changes nothing."""
        tokens = as_token_array(token_ids)
        path = self._walk(tokens, salt, extra_keys, len(tokens))
        cached = path.num_blocks * self.block_size
        if partial_block:
            name = self._namespace(salt, extra_keys)
            partial = self.tree.partial_next(name, path, tokens, len(tokens))
            cached += 0 if partial is None else partial[1]
        return cached

    def promote(
        self,
        token_ids: TokenIds,
        salt: str | None = None,
        max_tokens: int | None = None,
        extra_keys: Sequence[ExtraKey] = (),
        fetched: Mapping[int, Any] | None = None,
    ) -> int:
        """With a host or lower tier: cache in the pool the full blocks after
        ``token_ids[:max_tokens]``'s cached path that the tiers hold (confirmed by their
        tokens), so the next ``match`` finds them; their loads are queued (``take_tier_copies``,
        ``take_disk_loads``). Returns how many blocks were promoted; 0 without a tier, when the
        tiers hold none, or when the pool is full. With ``fetched`` (chain hash -> payload,
        fetched ahead for ``find_in_lower_tier``'s lookup) the lower tier's blocks come from it
        and the lower tier is not read."""
        if self.host_tier is None and self.lower_tier is None:
            return 0
        tokens = as_token_array(token_ids)
        limit = _token_limit(tokens, check_max_tokens(max_tokens))
        return promote_from_tier(self, tokens, salt, limit, canonical_extra_keys(extra_keys),
                                 fetched)  # fmt: skip

    def find_in_lower_tier(
        self,
        token_ids: TokenIds,
        salt: str | None = None,
        max_tokens: int | None = None,
        extra_keys: Sequence[ExtraKey] = (),
    ) -> LowerTierLookup | None:
        """The full blocks after ``token_ids[:max_tokens]``'s cached path and the host tier's
        blocks that the lower tier keeps, as handles to fetch ahead of ``promote(fetched=...)``;
        None without a lower tier or when it keeps none of them. Changes nothing."""
        if self.lower_tier is None:
            return None
        tokens = as_token_array(token_ids)
        limit = _token_limit(tokens, check_max_tokens(max_tokens))
        return find_in_lower_tier(self, tokens, salt, limit, canonical_extra_keys(extra_keys))

    def take_tier_copies(self) -> tuple[list[TierCopy], list[TierCopy]]:
        """The copies queued since the last call: write-backs ``(block, slot)`` (pool to tier)
        and loads ``(block, slot)`` (tier to pool). Contract: the caller carries out every
        write-back, then every load, before the next step writes into the pool and before this
        cache is asked for anything else."""
        writebacks, self._tier_writebacks = self._tier_writebacks, []
        loads, self._tier_loads = self._tier_loads, []
        if self.host_tier is not None:
            self.host_tier.take_loads()
        return [TierCopy(*c) for c in writebacks], [TierCopy(*c) for c in loads]

    def set_lower_tier(self, tier: LowerTier | None) -> None:
        """Attach the tier under the host tier: from now on every newly cached full block it
        does not hold is handed out for it (``take_persist``), and ``promote`` looks there
        past the pool and the host tier."""
        self.lower_tier = tier

    def take_persist(self) -> list[PersistBlock]:
        """The blocks cached since the last call that the lower tier does not hold. Contract:
        the caller reads their bytes before anything writes into the pool again."""
        persist, self._persist = self._persist, []
        return persist

    def take_disk_loads(self) -> list[tuple[int, bytes]]:
        """(pool block, payload) pairs ``promote`` read from the lower tier: write each
        payload into its block, after ``take_tier_copies``' copies, before the next step."""
        loads, self._disk_loads = self._disk_loads, []
        return loads

    def block_hashes(
        self, token_ids: TokenIds, salt: str | None = None, extra_keys: Sequence[ExtraKey] = ()
    ) -> list[int]:
        """The chained hashes of the full blocks of ``token_ids`` (what events and routers use)."""
        tokens = as_token_array(token_ids)
        name = self._namespace(salt, extra_keys)
        return chain_block_hashes(
            tokens,
            self.block_size,
            0,
            len(tokens) // self.block_size,
            self.tree.namespace_hash(name),
            self.tree.hasher,
        )

    # ------------------------------------------------------------------ blocks
    def can_allocate(self, n: int) -> bool:
        """Whether ``allocate(n)`` would succeed now."""
        short = check_block_count(n) - self.pool.num_free
        return short <= 0 or self._evictable_at_least(short)

    def allocate(self, n: int) -> list[int]:
        """``n`` blocks with ref 1: free ones first, then by evicting cached leaves.

        Raises CacheFull (nothing changed) when free + evictable blocks are fewer than ``n``.
        """
        n = check_block_count(n)
        short = n - self.pool.num_free
        if short > 0:
            if not self._evictable_at_least(short):
                raise CacheFull(
                    f"cannot allocate {n} blocks: {self.pool.num_free} free, fewer than {short} "
                    f"more evictable (in use {self.pool.num_in_use} of {self.num_blocks})"
                )
            self._evict(short)
        return self.pool.take_free(n)

    def insert(
        self,
        token_ids: TokenIds,
        block_ids: Sequence[int] | np.ndarray,
        salt: str | None = None,
        priority: int = 0,
        extra_keys: Sequence[ExtraKey] = (),
    ) -> int:
        """Cache the full blocks of ``token_ids``; ``block_ids[i]`` holds block ``i``.

        A prefix already cached keeps its block (the caller's copy is not cached and keeps its
        references). Blocks newly cached must be held (ref > 0) and not cached elsewhere.
        ``priority`` is an int in [MIN_PRIORITY, MAX_PRIORITY] (lower is evicted first).
        Returns the number of newly cached blocks.
        """
        tokens = as_token_array(token_ids)
        ids = as_block_ids(block_ids, self.num_blocks)
        check_priority(priority)
        num_full = len(tokens) // self.block_size
        if len(ids) < num_full:
            raise ValueError(f"{num_full} full blocks of tokens but only {len(ids)} block ids")
        name = self._namespace(salt, extra_keys)
        plan = self.tree.plan_insert(name, tokens, num_full)
        new_ids = ids[plan.path.num_blocks : num_full]
        if not plan.blocked:
            self._check_insertable(new_ids)
        self._touch(plan.path, priority)
        if plan.blocked or not len(new_ids):
            return 0
        _, changed, hashes = self.tree.commit_insert(plan, tokens, new_ids, priority, self._clock)
        for node in changed:
            self._refresh(node)
        self.blocks_stored += len(new_ids)
        if self.lower_tier is not None:
            self._queue_persist(name, plan.path, tokens, new_ids, hashes)
        if self.enable_events:
            parent = None if plan.path.num_blocks == 0 else plan.path.parent_hash
            first = plan.path.num_blocks * self.block_size
            block_tokens = tokens[first : num_full * self.block_size].tolist()
            self._emit(BlockStored(hashes, parent, block_tokens, self.block_size))
        return len(new_ids)

    def insert_partial(
        self,
        token_ids: TokenIds,
        block_id: int,
        salt: str | None = None,
        priority: int = 0,
        extra_keys: Sequence[ExtraKey] = (),
    ) -> bool:
        """Cache the last ``len(token_ids) % block_size`` tokens of ``token_ids``, held in
        ``block_id``, after their full blocks (the end of a finished request), so that
        ``match(partial_block=True)`` can hand them out for copying.

        The block must be held (ref > 0) and not cached elsewhere; from now on it is immutable
        (a write copies it first, see ``copy_on_write``). Nothing is cached (returns False)
        when the full blocks are not all cached, there is no partial block, or a cached block
        after them (``block_id`` itself included) already holds those tokens. A partial block
        makes no ``BlockStored`` event. ``priority`` is checked as ``insert`` checks it, even
        when nothing would be cached.
        """
        tokens = as_token_array(token_ids)
        block = as_block_id(block_id, self.num_blocks)
        check_priority(priority)
        full = len(tokens) // self.block_size
        if len(tokens) == full * self.block_size:
            return False
        name = self._namespace(salt, extra_keys)
        path = self.tree.walk(name, tokens, full)
        if path.num_blocks < full:
            return False
        # already held by a cached block (this one too: forked requests share a block)
        covering = self.tree.partial_next(name, path, tokens, len(tokens))
        if covering is not None and covering[1] == len(tokens) - full * self.block_size:
            return False
        self._check_insertable(np.array([block], dtype=np.int32))
        key = self.tree.partial_hash(path, tokens)  # a custom hasher may fail: before changes
        self._touch(path, priority)
        changed = self.tree.insert_partial(name, path, tokens, block, key, priority, self._clock)
        if changed is None:
            return False
        for node in changed:
            self._refresh(node)
        self.blocks_stored += 1
        return True

    def release(self, block_ids: Sequence[int] | np.ndarray) -> None:
        """Drop one reference per occurrence of each block (a double free raises ValueError)."""
        if isinstance(block_ids, list) and len(block_ids) == 1:  # a copy-on-write's source
            self._release_one(as_block_id(block_ids[0], self.num_blocks))
            return
        unique, counts = np.unique(as_block_ids(block_ids, self.num_blocks), return_counts=True)
        refs = self.pool.ref[unique]
        over = counts > refs
        if over.any():
            bad = int(unique[over][0])
            raise ValueError(
                f"block {bad} released more times than it is held "
                f"(ref {int(self.pool.ref[bad])}): double free"
            )
        self.pool.add_refs(unique, -counts)
        self._after_release(unique[counts == refs])

    def _release_one(self, block: int) -> None:
        """``release([block])`` without arrays."""
        if self.pool.ref[block] == 0:
            raise ValueError(
                f"block {block} released more times than it is held (ref 0): double free"
            )
        if self.pool.drop_ref(block):
            return
        owner = int(self.tree.node_of[block])
        if owner < 0:
            self.pool.put_free(np.array([block], dtype=np.int32))
            return
        node = self.tree.nodes[owner]
        assert node is not None
        self._refresh(node)

    def fork(self, block_ids: Sequence[int] | np.ndarray) -> None:
        """One more reference on each block (share a sequence's blocks with a branch)."""
        unique, counts = np.unique(as_block_ids(block_ids, self.num_blocks), return_counts=True)
        unheld = self.pool.ref[unique] == 0
        if unheld.any():
            raise ValueError(f"cannot fork block {int(unique[unheld][0])}: it is not in use")
        self.pool.add_refs(unique, counts)

    def copy_on_write(self, block_id: int) -> tuple[int, CopyOp | None]:
        """Make ``block_id`` safe to write: shared (ref > 1) or cached (immutable) blocks get a
        new block, the old one loses this reference, and the runner must apply the CopyOp.
        A block held once and not cached is written in place: ``(block_id, None)``."""
        block = as_block_id(block_id, self.num_blocks)
        ref = int(self.pool.ref[block])
        if ref == 0:
            raise ValueError(f"cannot write block {block}: it is not in use")
        if ref == 1 and self.tree.node_of[block] < 0:
            return block, None
        (new_block,) = self.allocate(1)
        self.release([block])
        return new_block, CopyOp(block, new_block)

    # ------------------------------------------------------------------ pinning and reset
    def pin(
        self, token_ids: TokenIds, salt: str | None = None, extra_keys: Sequence[ExtraKey] = ()
    ) -> int:
        """Keep the cached prefix of ``token_ids`` from eviction until ``unpin``: its full
        blocks, and the cached partial block holding the tokens after them if there is one.

        Returns the pinned length in tokens (0: nothing cached, nothing pinned). Pins count.
        """
        tokens = as_token_array(token_ids)
        path = self._walk(tokens, salt, extra_keys, len(tokens))
        tail = self._partial_leaf(tokens, path, salt, extra_keys)
        if tail is not None:  # the deepest node: pinning it keeps its whole path
            node, shared = tail
        elif not path.num_blocks:
            return 0
        else:
            node, matched = path.steps[-1]
            if matched < len(node.block_ids):
                node = self.tree.split(node, matched)
            shared = 0
        node.pin_count += 1
        self._pinned.add(node)
        self._refresh(node)
        return path.num_blocks * self.block_size + shared

    def unpin(
        self, token_ids: TokenIds, salt: str | None = None, extra_keys: Sequence[ExtraKey] = ()
    ) -> None:
        """Release the deepest pin on the cached path of ``token_ids`` (ValueError if none)."""
        tokens = as_token_array(token_ids)
        path = self._walk(tokens, salt, extra_keys, len(tokens))
        tail = self._partial_leaf(tokens, path, salt, extra_keys)
        deepest = [] if tail is None else [(tail[0], len(tail[0].block_ids))]
        for node, matched in [*deepest, *reversed(path.steps)]:
            if node.pin_count and matched == len(node.block_ids):
                node.pin_count -= 1
                if not node.pin_count:
                    self._pinned.discard(node)
                self._refresh(node)
                return
        raise ValueError("no pinned prefix of these tokens is cached")

    def reset(self, host_tier: bool = True) -> int:
        """Evict every evictable block (pins and references respected), nothing written back;
        with ``host_tier`` the tier is emptied too. Returns how many pool blocks were evicted."""
        total = 0
        while len(self.index):
            node = self.tree.nodes[self.index.first()]
            assert node is not None
            total += self._evict_from(node, len(node.block_ids), write_back=False)
        if host_tier and self.host_tier is not None:
            self.host_tier.clear()
        return total

    # ------------------------------------------------------------------ observability
    def stats(self) -> dict[str, Any]:
        """Counters and usage; ``free + in_use + cached == num_blocks``."""
        free, in_use = self.pool.num_free, self.pool.num_in_use
        return {
            "num_blocks": self.num_blocks,
            "block_size": self.block_size,
            "free": free,
            "in_use": in_use,
            "cached": self.num_blocks - free - in_use,
            "cached_blocks_total": self.tree.num_cached,
            "usage": in_use / self.num_blocks,
            "query_tokens": self.query_tokens,
            "hit_tokens": self.hit_tokens,
            "hit_rate": self.hit_tokens / self.query_tokens if self.query_tokens else 0.0,
            "evictions": self.evictions,
            "blocks_stored": self.blocks_stored,
            "blocks_removed": self.blocks_removed,
            "nodes": sum(node is not None for node in self.tree.nodes),
            "pinned_nodes": len(self._pinned),
            "pinned_blocks": self.num_pinned_blocks,
            **self._tier_stats(),
        }

    def _queue_persist(self, name: NamespaceName, path: PathMatch, tokens: np.ndarray,
                       new_ids: np.ndarray, hashes: list[int]) -> None:  # fmt: skip
        tier = self.lower_tier
        assert tier is not None
        bs = self.block_size
        parent = path.parent_hash
        for i, (block, block_hash) in enumerate(zip(new_ids.tolist(), hashes, strict=True)):
            if not tier.holds(name, block_hash):
                start = (path.num_blocks + i) * bs
                self._persist.append(PersistBlock(
                    block, name, block_hash, parent, tuple(tokens[start : start + bs].tolist())
                ))
            parent = block_hash

    def _tier_stats(self) -> dict[str, int]:
        lower = {} if self.lower_tier is None else {
            "lower_tier_hit_tokens": self.lower_tier_hit_blocks * self.block_size
        }  # fmt: skip
        if self.host_tier is None:
            return lower
        tier = self.host_tier.stats()
        return lower | {
            "host_tier_slots": tier["slots"], "host_tier_blocks": tier["blocks"],
            "host_tier_stores": tier["stores"], "host_tier_evictions": tier["evictions"],
            "host_tier_hit_tokens": self.tier_hit_blocks * self.block_size,
        }  # fmt: skip

    def drain_events(self) -> list[CacheEvent]:
        """Stored/removed block-hash events since the last drain (empty unless enabled)."""
        events, self._events = self._events, []
        return events

    def set_event_listener(self, listener: Callable[[CacheEvent], None] | None) -> None:
        """Hand every event to ``listener`` as it happens, on the thread that changed the cache
        (a publisher on another thread needs no lock around the cache), instead of keeping it
        for ``drain_events``; turns events on. None goes back to keeping them."""
        if listener is not None:
            self.enable_events = True
            self._events.clear()
        self._event_listener = listener

    def _emit(self, event: CacheEvent) -> None:
        if self._event_listener is None:
            self._events.append(event)
        else:
            self._event_listener(event)

    def check_invariants(self) -> None:
        """Raise AssertionError if any internal invariant is broken."""
        check_cache_invariants(self)

    # ------------------------------------------------------------------ internals
    def _namespace(self, salt: str | None, extra_keys: Sequence[ExtraKey]) -> NamespaceName:
        """The checked namespace name: (salt, extra keys in canonical form)."""
        check_salt(salt)
        return (salt, canonical_extra_keys(extra_keys))

    def _walk(
        self,
        tokens: np.ndarray,
        salt: str | None,
        extra_keys: Sequence[ExtraKey],
        limit: int,
    ) -> PathMatch:
        """The cached full blocks along ``tokens[:limit]``."""
        return self.tree.walk(self._namespace(salt, extra_keys), tokens, limit // self.block_size)

    def _partial_leaf(
        self,
        tokens: np.ndarray,
        path: PathMatch,
        salt: str | None,
        extra_keys: Sequence[ExtraKey],
    ) -> tuple[RadixNode, int] | None:
        """The cached partial block's leaf that holds the tokens after ``path`` (every one of
        them), with how many those are; None if there is none."""
        found = self.tree.partial_next(
            self._namespace(salt, extra_keys), path, tokens, len(tokens)
        )
        if found is None:
            return None
        block, shared = found
        if not self.tree.is_partial(block) or shared < len(tokens) - path.num_blocks * (
            self.block_size
        ):
            return None
        node = self.tree.nodes[int(self.tree.node_of[block])]
        assert node is not None
        return node, shared

    def _touch(self, path: PathMatch, priority: int | None = None) -> None:
        """Refresh the recency (and raise the priority) of exactly the matched blocks: a node
        matched only in part is split first, so its unmatched tail keeps its old recency."""
        if path.steps:
            node, matched = path.steps[-1]
            if matched < len(node.block_ids):
                path.steps[-1] = (self.tree.split(node, matched), matched)
        self._clock += 1
        for node, _ in path.steps:
            node.last_access = self._clock
            if priority is not None:
                node.priority = max(node.priority, priority)
            self._refresh(node)

    def _touch_block(self, block: int) -> None:
        """Refresh the recency of the one cached ``block`` a partial hit used, as ``_touch``
        does for full blocks (same clock tick): the first block of its node (``_touch`` split
        a node matched in part, and other candidates start a child), split off when the node
        holds more, so the blocks after it keep their old recency."""
        node = self.tree.nodes[int(self.tree.node_of[block])]
        assert node is not None and int(node.block_ids[0]) == block
        if len(node.block_ids) > 1:
            node = self.tree.split(node, 1)
        node.last_access = self._clock
        self._refresh(node)  # a leaf whose last block this is stops being evictable

    def _is_evictable(self, node: RadixNode) -> bool:
        return (
            node.parent is not None
            and node.children is None
            and node.pin_count == 0
            and len(node.block_ids) > 0
            and self.pool.ref[node.block_ids[-1]] == 0
        )

    def _refresh(self, node: RadixNode) -> None:
        self.index.set_evictable(node, self._is_evictable(node))

    def _check_insertable(self, new_ids: np.ndarray) -> None:
        if len(new_ids) <= _FEW_IDS:  # a step's few new blocks: scalar reads, no array passes
            ids = new_ids.tolist()
            if len(set(ids)) != len(ids):
                raise ValueError("a block id appears twice among the blocks to cache")
            for block in ids:
                if self.pool.ref[block] == 0:
                    raise ValueError(f"block {block} is not in use; allocate it first")
            for block in ids:
                if self.tree.node_of[block] >= 0:
                    raise ValueError(f"block {block} already caches another prefix")
            return
        if len(np.unique(new_ids)) != len(new_ids):
            raise ValueError("a block id appears twice among the blocks to cache")
        unheld = self.pool.ref[new_ids] == 0
        if unheld.any():
            raise ValueError(f"block {int(new_ids[unheld][0])} is not in use; allocate it first")
        cached = self.tree.node_of[new_ids] >= 0
        if cached.any():
            raise ValueError(f"block {int(new_ids[cached][0])} already caches another prefix")

    def _after_release(self, zeroed: np.ndarray) -> None:  # zeroed: [n] blocks now at ref 0
        owners = self.tree.node_of[zeroed]
        self.pool.put_free(zeroed[owners < 0].astype(np.int32, copy=False))
        for idx in np.unique(owners[owners >= 0]).tolist():
            node = self.tree.nodes[idx]
            assert node is not None
            self._refresh(node)

    def _reclaimable_tail(self, node: RadixNode) -> int:
        """How many trailing blocks of ``node`` have no reference."""
        held = np.flatnonzero(self.pool.ref[node.block_ids])
        return len(node.block_ids) - (int(held[-1]) + 1 if len(held) else 0)

    def _evictable_at_least(self, need: int) -> bool:
        """Whether ``need`` blocks can be evicted, peeling leaves virtually (nothing changes)."""
        if not len(self.index):
            return False
        if need == 1:  # every indexed leaf has an unreferenced last block
            return True
        found = 0
        emptied_children: dict[int, int] = {}
        for idx in self.index.node_indices():
            node = self.tree.nodes[idx]
            while node is not None:
                tail = self._reclaimable_tail(node)
                found += tail
                if found >= need:
                    return True
                parent = node.parent
                if tail < len(node.block_ids) or parent is None or parent.is_root:
                    break
                emptied = emptied_children.get(parent.idx, 0) + 1
                emptied_children[parent.idx] = emptied
                if parent.pin_count or emptied < len(parent.children or ()):
                    break
                node = parent
        return False

    def _evict(self, need: int) -> None:
        """Evict exactly ``need`` blocks in index order (caller checked it is possible)."""
        while need > 0:
            node = self.tree.nodes[self.index.first()]
            assert node is not None
            need -= self._evict_from(node, need)

    def _evict_from(self, node: RadixNode, limit: int, write_back: bool = True) -> int:
        """Evict up to ``limit`` unreferenced tail blocks of evictable leaf ``node`` (full ones
        offered to the host tier first, unless not ``write_back``)."""
        # the index guarantees the last block is unreferenced, so one block needs no scan
        count = 1 if limit == 1 else min(self._reclaimable_tail(node), limit)
        parent = node.parent
        whole = count == len(node.block_ids)
        if whole:
            self.index.set_evictable(node, False)
        full = not self.tree.is_partial(int(node.block_ids[-1]))
        if full and write_back and self.host_tier is not None:
            offer_evicted(self, node, count)
        removed = self.tree.remove_tail(node, count)
        self.pool.put_free(removed)
        self.evictions += count
        self.blocks_removed += count
        if self.enable_events and full:  # a partial block was never announced
            self._emit(BlockRemoved([int(h) for h in self.tree.hashes[removed]]))
        if not whole:
            self._refresh(node)
        elif parent is not None and not parent.is_root:
            self._refresh(parent)
        return count


_FEW_IDS = 8
"""Up to this many block ids are checked one by one (cheaper than numpy's passes)."""


def _token_limit(tokens: np.ndarray, max_tokens: int | None) -> int:
    """How many leading tokens a lookup may use: all, or at most ``max_tokens`` (checked
    by ``check_max_tokens``: None or an int >= 0)."""
    return len(tokens) if max_tokens is None else min(len(tokens), max_tokens)
