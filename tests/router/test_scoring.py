"""RoutingPolicy.choose: the one decision the HTTP router, Ray and the simulator share."""

from __future__ import annotations

import numpy as np
import pytest

from prefixcache.integrations.router.scoring import (
    ROUTING_POLICIES,
    CostModel,
    RoutingPolicy,
    rendezvous_order,
)

COST = CostModel(prefill_s_per_token=1e-3, decode_s_per_token=1e-2)


def choose(policy: RoutingPolicy, cached, backlog, key=7, **kw) -> int:
    return policy.choose(1000, np.array(cached, float), np.array(backlog, float), key, **kw)


def test_cache_aware_follows_the_cache_until_the_queue_outweighs_it() -> None:
    policy = RoutingPolicy("cache_aware", COST)
    assert choose(policy, [0, 900, 0], [0, 0, 0]) == 1
    # backend 1 saves 0.9 s of prefill; 0.7 s of queue is worth waiting, 1.0 s is not
    assert choose(policy, [0, 900, 0], [0, 0.7, 0]) == 1
    assert choose(policy, [0, 900, 0], [0.5, 1.0, 0]) == 2
    assert policy.estimated_ttft_s(1000, np.array([0, 900.0]), np.array([0.2, 0.0])).tolist() \
        == pytest.approx([1.2, 0.1])  # fmt: skip


def test_a_small_shared_header_does_not_pull_new_prefixes_to_one_backend() -> None:
    policy = RoutingPolicy("cache_aware", COST, tie_fraction=0.1)
    homes = {choose(policy, [16, 0, 0, 0], [0] * 4, key) for key in range(100)}
    assert homes == {0, 1, 2, 3}  # 16 of 1000 tokens: within the tie window
    assert {choose(policy, [200, 0, 0, 0], [0] * 4, key) for key in range(100)} == {0}


def test_ties_go_to_the_affinity_home_and_stay_there() -> None:
    policy = RoutingPolicy("cache_aware", COST)
    homes = {key: choose(policy, [0] * 5, [0] * 5, key) for key in range(200)}
    assert homes == {key: choose(policy, [0] * 5, [0] * 5, key) for key in range(200)}
    counts = np.bincount(list(homes.values()), minlength=5)
    assert counts.min() >= 20  # spread over every backend
    assert homes[3] == int(np.argmax(rendezvous_order(3, 5)))


def test_rendezvous_moves_only_the_keys_of_a_removed_backend() -> None:
    before = {k: int(np.argmax(rendezvous_order(k, 6))) for k in range(500)}
    alive = np.array([True, True, False, True, True, True])
    policy = RoutingPolicy("session_hash")
    after = {k: choose(policy, [0] * 6, [0] * 6, k, healthy=alive) for k in range(500)}
    moved = {k for k in before if before[k] != after[k]}
    assert moved == {k for k in before if before[k] == 2}
    assert all(after[k] != 2 for k in after)


def test_unhealthy_backends_are_never_chosen_and_none_healthy_raises() -> None:
    alive = np.array([False, True, False])
    for name in ROUTING_POLICIES:
        policy = RoutingPolicy(name, COST)
        for key in range(20):
            assert choose(policy, [1000, 0, 1000], [0, 5, 0], key, healthy=alive) == 1
        with pytest.raises(ValueError, match="no healthy backend"):
            choose(policy, [0, 0, 0], [0, 0, 0], healthy=np.zeros(3, bool))


def test_a_session_sticks_while_within_the_slack() -> None:
    policy = RoutingPolicy("cache_aware", COST, sticky_slack_s=0.3)
    assert choose(policy, [0, 0], [0.2, 0], sticky=0) == 0
    assert choose(policy, [0, 0], [0.4, 0], sticky=0) == 1


def test_round_robin_least_load_random() -> None:
    rr = RoutingPolicy("round_robin")
    assert [choose(rr, [0] * 3, [0] * 3) for _ in range(6)] == [0, 1, 2, 0, 1, 2]
    least = RoutingPolicy("least_load", seed=1)
    assert choose(least, [1000, 0, 0], [0.3, 0.1, 0.2]) == 1
    assert {choose(least, [0] * 4, [0] * 4) for _ in range(60)} == {0, 1, 2, 3}
    first, second = RoutingPolicy("random", seed=5), RoutingPolicy("random", seed=5)
    draws = [choose(first, [0] * 4, [0] * 4) for _ in range(40)]
    assert draws == [choose(second, [0] * 4, [0] * 4) for _ in range(40)]
    assert set(draws) == {0, 1, 2, 3}


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="unknown routing policy"):
        RoutingPolicy("fastest")
    with pytest.raises(ValueError, match="prefill_s_per_token"):
        CostModel(prefill_s_per_token=-1)
    with pytest.raises(ValueError, match="no healthy backend"):
        RoutingPolicy("cache_aware").choose(10, np.zeros(0), np.zeros(0), 1)
