"""Stateful check of the eviction *order*: lowest priority first, then least recently used.

Recency is per block: the last match or insert that covered it. The reference replays the
policy exactly (priorities are fixed per salt, so no two candidates ever tie) and every
allocation must evict precisely the blocks it predicts.
"""

from __future__ import annotations

from hypothesis import HealthCheck, settings
from test_cache_stateful import CacheMachine


class LruOrderMachine(CacheMachine):
    """CacheMachine whose reference predicts which blocks each allocation evicts."""

    predict_order = True


LruOrderMachine.TestCase.settings = settings(
    max_examples=30,
    stateful_step_count=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
TestLruOrderStateful = LruOrderMachine.TestCase
