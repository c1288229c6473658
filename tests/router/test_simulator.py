"""The trace simulator: replicas are real prefix caches, policies route by the shared scorer."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from prefixcache import PrefixCache
from prefixcache.integrations.router.mooncake_trace import (
    TraceFormatError,
    TraceRequest,
    load_mooncake,
)
from prefixcache.integrations.router.scoring import CostModel
from prefixcache.integrations.router.simulator import (
    ORACLE,
    SIM_POLICIES,
    SimConfig,
    cache_prompt,
    simulate,
    simulate_all,
    working_set_blocks,
)

TRACE = Path(__file__).parents[2] / "benchmarks" / "traces" / "mooncake_synthetic_trace.jsonl.gz"
COST = CostModel(prefill_s_per_token=1e-4, decode_s_per_token=1e-3)


def sessions_trace(sessions: int = 12, turns: int = 6, gap_s: float = 0.5) -> list[TraceRequest]:
    """Multi-turn sessions: each turn resends the session's history and adds 2 blocks."""
    rng = np.random.default_rng(0)
    requests, next_id = [], 0
    histories = [[] for _ in range(sessions)]
    for turn in range(turns):
        for session in rng.permutation(sessions).tolist():
            histories[session] += [next_id, next_id + 1]
            next_id += 2
            blocks = np.array(histories[session], dtype=np.int32)
            arrival = turn * gap_s * sessions + len(requests) * 1e-3
            requests.append(TraceRequest(arrival, len(blocks) * 512 + 100, 20, blocks))
    return sorted(requests, key=lambda r: r.arrival_s)


def test_cache_prompt_hits_the_prefix_and_caches_what_fits() -> None:
    cache = PrefixCache(4, 1)
    assert cache_prompt(cache, np.array([1, 2, 3], np.int32)) == 0
    assert cache_prompt(cache, np.array([1, 2, 9, 9, 9, 9], np.int32)) == 2
    assert cache.lookup(np.array([1, 2, 9, 9], np.int32)) == 4  # only 4 blocks fit
    cache.check_invariants()
    assert cache.stats()["in_use"] == 0


def test_cache_aware_keeps_sessions_together_round_robin_scatters_them() -> None:
    trace = sessions_trace()
    config = SimConfig(4, working_set_blocks(trace) // 4 + 4, cost=COST)
    results = simulate_all(trace, config, [ORACLE, *SIM_POLICIES])
    rates = {name: r.summary()["hit_rate"] for name, r in results.items()}
    assert rates["cache_aware"] >= 0.95 * rates[ORACLE] > 0.5
    assert rates["session_hash"] >= 0.8 * rates[ORACLE]
    assert rates["round_robin"] < 0.6 * rates["cache_aware"]
    for result in results.values():
        assert len(result.ttft_s) == len(trace) and (result.ttft_s > 0).all()
        assert result.busy_s.sum() == pytest.approx(
            sum(r.output_length for r in trace) * COST.decode_s_per_token
            + (result.query_tokens - result.hit_tokens) * COST.prefill_s_per_token
        )


def test_approximate_index_equals_precise_when_it_knows_the_capacity() -> None:
    trace = sessions_trace(turns=8)
    config = SimConfig(3, 20, cost=COST)
    precise = simulate(trace, config, "cache_aware").summary()
    approx = simulate(trace, config, "cache_aware_approx").summary()
    assert {k: v for k, v in precise.items() if k != "wall_s"} == {
        k: v for k, v in approx.items() if k != "wall_s"
    }
    smaller = SimConfig(3, 20, cost=COST, approx_blocks=4)
    assert simulate(trace, smaller, "cache_aware_approx").hit_tokens < simulate(
        trace, config, "cache_aware"
    ).hit_tokens


def test_mooncake_trace_targets_at_8_replicas() -> None:
    trace = load_mooncake(TRACE)
    assert len(trace) == 3993 and working_set_blocks(trace) == 40148
    config = SimConfig(8, 40148 // 8 + 1, rate_scale=2.5)
    rows = {n: simulate(trace, config, n).summary() for n in (ORACLE, "cache_aware", "round_robin")}
    assert rows["cache_aware"]["hit_rate"] >= 0.9 * rows[ORACLE]["hit_rate"]
    assert rows["cache_aware"]["ttft_p90_s"] * 5 <= rows["round_robin"]["ttft_p90_s"]
    assert rows["cache_aware"]["imbalance"] <= 1.3


def test_loader_reads_milliseconds_full_blocks_and_names_bad_lines(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    lines = [
        {"timestamp": 1500, "input_length": 1100, "output_length": 3, "hash_ids": [4, 5, 6]},
        {"timestamp": 0, "input_length": 512, "output_length": 1, "hash_ids": [4]},
    ]
    path.write_text("\n".join(json.dumps(line) for line in lines) + "\n\n")
    first, second = load_mooncake(path)
    assert (first.arrival_s, first.blocks.tolist()) == (0.0, [4])
    assert (second.arrival_s, second.blocks.tolist(), second.input_length) == (1.5, [4, 5], 1100)
    assert len(load_mooncake(path, limit=1)) == 1
    for bad, message in [
        ('{"timestamp": 0}', "missing 'input_length'"),
        ("[1]", "expected a JSON object"),
        ('{"timestamp": -1, "input_length": 1, "output_length": 1, "hash_ids": []}', "timestamp"),
        ('{"timestamp": 0, "input_length": 1024, "output_length": 1, "hash_ids": [1]}', "cover"),
        ('{"timestamp": 0, "input_length": 5, "output_length": 1, "hash_ids": [true]}', "hash_ids"),
        ("not json", "line 2"),
    ]:
        path.write_text(json.dumps(lines[0]) + "\n" + bad + "\n")
        with pytest.raises(TraceFormatError, match=message):
            load_mooncake(path)
    with pytest.raises(TraceFormatError, match="cannot read"):
        load_mooncake(tmp_path / "missing.jsonl")
    (tmp_path / "empty.jsonl").write_text("\n")
    with pytest.raises(TraceFormatError, match="no requests"):
        load_mooncake(tmp_path / "empty.jsonl")


def test_bad_config_and_policy() -> None:
    with pytest.raises(ValueError, match="replicas"):
        SimConfig(0, 10)
    with pytest.raises(ValueError, match="rate_scale"):
        SimConfig(2, 10, rate_scale=0)
    with pytest.raises(ValueError, match="unknown policy"):
        simulate(sessions_trace(), SimConfig(2, 10), "fastest")
