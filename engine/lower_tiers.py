"""The tiers under the host tier, in order (the local disk, then the shared store), as the one
``LowerTier`` the prefix cache knows: a block is persisted to every tier that lacks it, and a
prompt's next blocks are looked for in the first tier, then the next one from where it stopped.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from prefixcache.host_tier import PersistBlock


class PersistentTier(Protocol):
    def holds(self, name: Any, block_hash: int) -> bool: ...
    def find(self, name: Any, parent_hash: int, hashes: list[int],
             tokens: list[tuple[int, ...]]) -> list[Any]: ...  # fmt: skip
    def fetch(self, name: Any, handles: Sequence[Any]) -> list[Any]: ...
    def persist(self, entries: Sequence[PersistBlock]) -> None: ...
    def flush(self) -> None: ...
    def stats(self) -> dict[str, int]: ...


class LowerTiers:
    """``tiers`` in lookup order; handles are (tier index, the tier's handle)."""

    def __init__(self, tiers: Sequence[PersistentTier]) -> None:
        self.tiers = list(tiers)

    def holds(self, name: Any, block_hash: int) -> bool:
        return all(tier.holds(name, block_hash) for tier in self.tiers)

    def find(self, name: Any, parent_hash: int, hashes: list[int],
             tokens: list[tuple[int, ...]]) -> list[tuple[int, Any]]:  # fmt: skip
        found: list[tuple[int, Any]] = []
        for index, tier in enumerate(self.tiers):
            start = len(found)
            if start == len(hashes):
                break
            parent = hashes[start - 1] if start else parent_hash
            found += [(index, h) for h in tier.find(name, parent, hashes[start:], tokens[start:])]
        return found

    def fetch(self, name: Any, handles: Sequence[tuple[int, Any]]) -> list[Any]:
        """Payloads in order, up to the first a tier cannot give (checked by that tier)."""
        payloads: list[Any] = []
        for index, tier in enumerate(self.tiers):
            mine = [h for i, h in handles if i == index]
            if not mine:
                continue
            got = tier.fetch(name, mine)
            payloads += got
            if len(got) < len(mine):
                break
        return payloads

    def persist(self, entries: Sequence[PersistBlock]) -> None:
        for tier in self.tiers:
            missing = [e for e in entries if not tier.holds(e.name, e.block_hash)]
            if missing:
                tier.persist(missing)

    def flush(self) -> None:
        for tier in self.tiers:
            tier.flush()

    def stats(self) -> dict[str, int]:
        merged: dict[str, int] = {}
        for tier in self.tiers:
            merged.update(tier.stats())
        return merged
