"""Reads the lower KV tiers (disk, shared store) ahead of a request's admission, on a thread of
its own: the request waits in the loading state while the scheduler keeps stepping the others,
and is admitted with the payloads in hand (``PrefixCache.promote(fetched=...)``), so the step
loop never waits on a file or a socket while there is other work.

A fetch never raises: a tier that fails reads as fewer payloads (its own checks and counters
say why), and the request computes what was not read.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from typing import Any

from prefixcache.tier_moves import LowerTierLookup

log = logging.getLogger(__name__)

Fetched = dict[int, Any]  # chain hash -> payload


class TierFetcher:
    """Fetches ``LowerTierLookup``s through ``fetch(name, handles) -> payloads`` (a
    ``LowerTiers``) on one background thread."""

    def __init__(self, fetch: Callable[[Any, Sequence[Any]], list[Any]]) -> None:
        self._fetch = fetch
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="kv-tier-fetch")
        self.fetches = 0
        self.failures = 0

    def submit(self, lookup: LowerTierLookup) -> Future[Fetched]:
        """Start reading ``lookup``'s blocks; the future's result maps each chain hash read to
        its payload (a prefix of ``lookup.hashes``, empty when nothing could be read)."""
        self.fetches += 1
        return self._pool.submit(self._run, lookup)

    @staticmethod
    def wait_first(futures: Sequence[Future[Fetched]], timeout: float) -> None:
        """Block until one of ``futures`` is done or ``timeout`` seconds passed."""
        wait(futures, timeout=timeout, return_when=FIRST_COMPLETED)

    def close(self) -> None:
        self._pool.shutdown(wait=True)

    def _run(self, lookup: LowerTierLookup) -> Fetched:
        try:
            payloads = self._fetch(lookup.name, lookup.handles)
        except Exception:  # a tier's own errors are contained by it; anything else is a miss
            self.failures += 1
            log.exception("reading %d KV blocks from the lower tiers failed", len(lookup.hashes))
            payloads = []
        return dict(zip(lookup.hashes, payloads, strict=False))
