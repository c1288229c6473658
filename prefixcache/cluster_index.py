"""ClusterIndex: which backends hold which prefixes, learned from their cache events.

A router asks one question per request: for each backend, how many leading blocks of this
prompt does it hold? Keys here are chained block hashes the index computes itself from the
events' token ids (``h_i = hasher(tokens of block i, seed=h_{i-1})`` from a fixed root), so
backends with any hash function, seed or salt scheme are compared on one prompt hashed once.
A backend's own hash values only name its blocks for a later ``BlockRemoved``.

One map ``our hash -> {backend: copies}`` serves every backend: a prompt's match costs its
blocks plus the holders met on the way, however many backends there are (a radix tree per
backend would cost backends x blocks). Hashes name candidates only: a collision can misroute
a request (a miss on the backend), never change an answer, which the backend confirms itself.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Sequence
from functools import partial
from itertools import islice, takewhile
from operator import is_

import numpy as np

from prefixcache.events import AllBlocksCleared, BlockRemoved, BlockStored, CacheEvent
from prefixcache.hashing import BlockHasher, chain_block_hashes, xxh3_block_hasher
from prefixcache.prompt_hash_memo import PromptHashMemo

BackendId = Hashable

ROOT_SEED = 0x7072656669786361  # the index's chain starts here ("prefixca")
_MAX_INTERNED = 4096  # distinct holder sets kept before the unused ones are dropped


class ClusterIndex:
    """Per-backend cached prefixes of one block size, fed by ``apply`` with cache events.

    ``match(prompt_hashes)`` returns, for every backend holding the prompt's first block, how
    many leading full blocks it holds. Events for a parent the index never saw (missed events,
    or blocks stored before the subscription) are counted in ``orphan_blocks`` and skipped;
    ``clear(backend)`` or ``AllBlocksCleared`` forgets a backend's blocks.
    """

    def __init__(self, block_size: int, hasher: BlockHasher = xxh3_block_hasher) -> None:
        if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 1:
            raise ValueError(f"block_size must be a positive int, got {block_size!r}")
        self.block_size = block_size
        self.hasher = hasher
        self._holders: dict[int, dict[BackendId, int]] = {}  # our hash -> {backend: copies}
        # our hash -> its holders as one shared frozenset per distinct set of backends, so a
        # prompt's blocks held by the same backends are one run of the same object in `match`
        self._holder_sets: dict[int, frozenset[BackendId]] = {}
        self._interned: dict[frozenset[BackendId], frozenset[BackendId]] = {}
        self._names: dict[BackendId, dict[int, int]] = {}  # backend -> {their hash: our hash}
        self.orphan_blocks = 0
        self.foreign_block_size_events = 0
        self.memo = PromptHashMemo()

    # ------------------------------------------------------------------ prompts
    def prompt_hashes(self, token_ids: Sequence[int] | np.ndarray) -> list[int]:
        """The index's chained hashes of the prompt's full blocks (hash once, match many; a
        prompt repeating or extending a recent one hashes only its new blocks, see
        ``PromptHashMemo``). The list may be shared with the memo: read it only."""
        tokens = np.ascontiguousarray(token_ids, dtype=np.int32)
        end = len(tokens) // self.block_size

        def chain(first: int, parent: int | None) -> list[int]:
            seed = ROOT_SEED if parent is None else parent
            return chain_block_hashes(tokens, self.block_size, first, end, seed, self.hasher)

        return self.memo.hashes(tokens, self.block_size, chain)

    def match(self, prompt_hashes: Sequence[int]) -> dict[BackendId, int]:
        """Leading blocks of the prompt each backend holds; backends holding none are absent.
        Walks runs of blocks with the same holders (one step a run, its length counted in C),
        not blocks: a 32K-token prompt is a few steps however many blocks it has."""
        sets = list(map(self._holder_sets.get, prompt_hashes))
        found: dict[BackendId, int] = {}
        alive: frozenset[BackendId] = frozenset()
        depth = 0
        while depth < len(sets):
            holders = sets[depth]
            if holders is None:
                break
            if depth == 0:
                alive = holders
            elif not holders >= alive:
                for backend in alive - holders:
                    found[backend] = depth
                alive = alive & holders
                if not alive:
                    break
            depth += len(list(takewhile(partial(is_, holders), islice(sets, depth, None))))
        for backend in alive:
            found[backend] = depth
        return found

    # ------------------------------------------------------------------ events
    def apply(self, backend: BackendId, event: CacheEvent) -> None:
        """Fold one event of ``backend``'s cache into the index."""
        if isinstance(event, BlockStored):
            self._stored(backend, event)
        elif isinstance(event, BlockRemoved):
            self._removed(backend, event.block_hashes)
        elif isinstance(event, AllBlocksCleared):
            self.clear(backend)
        else:
            raise TypeError(f"not a cache event: {type(event).__name__}")

    def apply_all(self, backend: BackendId, events: Iterable[CacheEvent]) -> None:
        for event in events:
            self.apply(backend, event)

    def clear(self, backend: BackendId) -> int:
        """Forget every block of ``backend`` (it died, restarted or cleared its cache); returns
        how many blocks were forgotten."""
        names = self._names.pop(backend, {})
        for ours in names.values():
            self._drop_holder(ours, backend, all_copies=True)
        return len(names)

    def backends(self) -> list[BackendId]:
        return list(self._names)

    def num_blocks(self, backend: BackendId) -> int:
        """Blocks of ``backend`` the index knows of."""
        return len(self._names.get(backend, ()))

    def _stored(self, backend: BackendId, event: BlockStored) -> None:
        if event.block_size != self.block_size:
            self.foreign_block_size_events += 1
            return
        names = self._names.setdefault(backend, {})
        theirs = event.block_hashes
        if len(event.token_ids) < len(theirs) * self.block_size:
            raise ValueError(
                f"BlockStored names {len(theirs)} blocks but carries {len(event.token_ids)} "
                f"token ids (block size {self.block_size})"
            )
        if event.parent_block_hash is None:
            parent = ROOT_SEED
        elif event.parent_block_hash in names:
            parent = names[event.parent_block_hash]
        else:
            self.orphan_blocks += len(theirs)
            return
        tokens = np.asarray(event.token_ids[: len(theirs) * self.block_size], dtype=np.int32)
        ours = chain_block_hashes(tokens, self.block_size, 0, len(theirs), parent, self.hasher)
        for their_hash, our_hash in zip(theirs, ours, strict=True):
            previous = names.get(their_hash)
            if previous == our_hash:
                continue  # a repeat (replayed batch): already counted
            if previous is not None:
                self._drop_holder(previous, backend)
            names[their_hash] = our_hash
            copies = self._holders.setdefault(our_hash, {})
            copies[backend] = copies.get(backend, 0) + 1
            if copies[backend] == 1:  # a new holder
                self._holders_changed(our_hash, copies)

    def _removed(self, backend: BackendId, their_hashes: Iterable[int]) -> None:
        names = self._names.get(backend)
        if names is None:
            return
        for their_hash in their_hashes:
            ours = names.pop(their_hash, None)
            if ours is not None:
                self._drop_holder(ours, backend)

    def _drop_holder(self, ours: int, backend: BackendId, all_copies: bool = False) -> None:
        copies = self._holders[ours]
        left = 0 if all_copies else copies[backend] - 1
        if left:
            copies[backend] = left
            return
        del copies[backend]
        if not copies:
            del self._holders[ours]
        self._holders_changed(ours, copies)

    def _holders_changed(self, ours: int, copies: dict[BackendId, int]) -> None:
        """Point ``ours`` at the interned set of its holders (none: forget it)."""
        if not copies:
            self._holder_sets.pop(ours, None)
            return
        if len(self._interned) > _MAX_INTERNED:  # keep only the sets still pointed at
            self._interned = {held: held for held in self._holder_sets.values()}
        key = frozenset(copies)
        self._holder_sets[ours] = self._interned.setdefault(key, key)

    # ------------------------------------------------------------------ checks
    def check_invariants(self) -> None:
        """Every holder count equals the backend's names mapping to that hash, and back."""
        counted: dict[int, dict[BackendId, int]] = {}
        for backend, names in self._names.items():
            for ours in names.values():
                per = counted.setdefault(ours, {})
                per[backend] = per.get(backend, 0) + 1
        assert counted == self._holders, "holders disagree with the backends' block names"
        assert all(self._holders.values()), "an empty holder set was kept"
        assert {ours: frozenset(copies) for ours, copies in self._holders.items()} == (
            self._holder_sets
        ), "the interned holder sets disagree with the holders"
