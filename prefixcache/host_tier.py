"""The index of a second KV tier (host memory): which full blocks it holds, found by the same
chained block hash as the pool's radix tree and confirmed against their token ids.

The tier has ``num_slots`` slots of one block each; the bytes live with the engine, which
copies a block into a slot (write-back) or out of one (load) when the cache asks. A slot holds
one block of one namespace: ``(namespace name, block hash)`` keys it, with the parent block's
hash and the block's tokens beside it, so a hit is confirmed exactly as in the tree (the same
namespace, the same parent, the same tokens) and a hash collision costs a miss, never another
prompt's KV. Slots are reused least recently used first; a slot with a load outstanding is not
reused until the loads are handed out (``take_loads``). Pure Python + numpy, no torch.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable, Sequence
from typing import Any, NamedTuple, Protocol

import numpy as np


class TierCopy(NamedTuple):
    """Copy the pool's block ``block`` to tier slot ``slot`` (a write-back) or back (a load)."""

    block: int
    slot: int


class PersistBlock(NamedTuple):
    """A block newly cached in the pool, for a persistent tier: pool block ``block`` holds the
    tokens ``tokens`` of namespace ``name``, chained from ``parent_hash`` to ``block_hash``."""

    block: int
    name: Hashable
    block_hash: int
    parent_hash: int
    tokens: tuple[int, ...]


class LowerTier(Protocol):
    """A tier under the host tier (the engine's disk tier): it keeps what ``PrefixCache``
    hands out (``take_persist``) and answers ``promote``'s lookups past the other tiers."""

    def holds(self, name: Hashable, block_hash: int) -> bool:
        """Whether the block is kept here already (it need not be persisted again)."""
        ...

    def find(self, name: Hashable, parent_hash: int, hashes: list[int],
             tokens: list[tuple[int, ...]]) -> list[Any]:  # fmt: skip
        """Handles of the longest run of ``hashes`` kept here with these parents and tokens."""
        ...

    def fetch(self, name: Hashable, handles: Sequence[Any]) -> list[bytes]:
        """The checked payloads of ``handles``, in order, up to the first that fails."""
        ...


class HostTierIndex:
    """What a host-memory tier of ``num_slots`` blocks of ``block_size`` tokens holds."""

    def __init__(self, num_slots: int, block_size: int) -> None:
        if isinstance(num_slots, bool) or not isinstance(num_slots, int) or num_slots < 1:
            raise ValueError(f"num_slots must be a positive int, got {num_slots!r}")
        self.num_slots = num_slots
        self.block_size = block_size
        self.slot_of: dict[tuple[Hashable, int], int] = {}
        self.key_of: list[tuple[Hashable, int] | None] = [None] * num_slots
        self.parent = np.zeros(num_slots, dtype=np.uint64)  # [num_slots]
        self.tokens = np.zeros((num_slots, block_size), dtype=np.int32)  # [num_slots, bs]
        self.recency: OrderedDict[int, None] = OrderedDict()  # held slots, oldest first
        self.free = list(range(num_slots - 1, -1, -1))
        self.loading: set[int] = set()  # slots with a load outstanding
        self.stores = 0  # blocks written in
        self.evictions = 0  # blocks dropped to make room

    def __len__(self) -> int:
        return len(self.slot_of)

    def offer(
        self,
        name: Hashable,
        parent_hash: int,
        hashes: list[int],
        tokens: np.ndarray,  # [n, block_size] int32, block i's tokens
    ) -> list[int]:
        """Blocks leaving the pool, in chain order (block 0's parent is ``parent_hash``): the
        slot to write each one into, or -1 when the tier already holds it (its recency is
        refreshed) or has no slot it may reuse (the block is dropped)."""
        slots = []
        previous = parent_hash
        for i, block_hash in enumerate(hashes):
            key = (name, block_hash)
            held = self.slot_of.get(key)
            if held is not None:
                self.recency.move_to_end(held)
                slots.append(-1)
            else:
                slot = self._take_slot()
                if slot >= 0:
                    self.slot_of[key] = slot
                    self.key_of[slot] = key
                    self.parent[slot] = previous
                    self.tokens[slot] = tokens[i]
                    self.recency[slot] = None
                    self.stores += 1
                slots.append(slot)
            previous = block_hash
        return slots

    def find(
        self,
        name: Hashable,
        parent_hash: int,
        hashes: list[int],
        tokens: np.ndarray,  # [n, block_size] int32: the prompt's next blocks
    ) -> list[int]:
        """The slots of the longest run of ``hashes`` the tier holds, each confirmed by its
        namespace, parent and tokens (a mismatch ends the run); refreshes their recency."""
        found = []
        previous = parent_hash
        for i, block_hash in enumerate(hashes):
            slot = self.slot_of.get((name, block_hash))
            if slot is None or int(self.parent[slot]) != previous:
                break
            if not np.array_equal(self.tokens[slot], tokens[i]):
                break
            found.append(slot)
            previous = block_hash
        for slot in found:
            self.recency.move_to_end(slot)
        return found

    def hold_for_load(self, slots: list[int]) -> None:
        """Keep ``slots`` from reuse until ``take_loads`` (their bytes are about to be read)."""
        self.loading.update(slots)

    def take_loads(self) -> None:
        """The outstanding loads were handed to the engine: their slots may be reused again
        (a slot ``clear`` emptied while it was loading goes back to the free list)."""
        for slot in sorted(self.loading, reverse=True):
            if self.key_of[slot] is None:
                self.free.append(slot)
        self.loading.clear()

    def clear(self) -> int:
        """Forget every block (slots with a load outstanding too: the bytes stay until
        reused); returns how many were held."""
        held = len(self.slot_of)
        self.slot_of.clear()
        self.key_of = [None] * self.num_slots
        self.recency.clear()
        self.free = [s for s in range(self.num_slots - 1, -1, -1) if s not in self.loading]
        return held

    def stats(self) -> dict[str, int]:
        return {
            "slots": self.num_slots, "blocks": len(self.slot_of), "stores": self.stores,
            "evictions": self.evictions,
        }  # fmt: skip

    def check_invariants(self) -> None:
        """Raise AssertionError if the index disagrees with itself."""
        held = [s for s, key in enumerate(self.key_of) if key is not None]
        assert len(held) == len(self.slot_of) == len(self.recency)
        assert set(held) == set(self.recency)
        for key, slot in self.slot_of.items():
            assert self.key_of[slot] == key
        assert not set(held) & set(self.free)
        assert len(set(self.free)) == len(self.free)
        empty_loading = {s for s in self.loading if self.key_of[s] is None}
        assert not empty_loading & set(self.free)
        assert len(held) + len(self.free) + len(empty_loading) == self.num_slots

    def _take_slot(self) -> int:
        """A free slot, else the least recently used one without a load outstanding (its
        block is dropped), else -1."""
        if self.free:
            return self.free.pop()
        for slot in self.recency:
            if slot not in self.loading:
                key = self.key_of[slot]
                assert key is not None
                del self.slot_of[key], self.recency[slot]
                self.key_of[slot] = None
                self.evictions += 1
                return slot
        return -1
