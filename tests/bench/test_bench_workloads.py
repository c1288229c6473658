"""Workload generation: exact token counts, shared-prefix structure, determinism."""

from __future__ import annotations

import pytest

from prefixcache.integrations.bench.bench_request import interleave
from prefixcache.integrations.bench.token_source import TokenRange
from prefixcache.integrations.bench.workload_agent import AgentConfig, build_agent
from prefixcache.integrations.bench.workload_prefix_repetition import (
    PrefixRepetitionConfig,
    build_prefix_repetition,
)
from prefixcache.integrations.bench.workload_rag import RagConfig, build_rag, zipf_weights
from prefixcache.integrations.bench.workload_registry import build_requests, workload_config
from prefixcache.integrations.bench.workload_shared_prefix import (
    SharedPrefixConfig,
    build_shared_prefix,
)

TOKENS = TokenRange.for_vocab(49152)


def test_shared_prefix_exact_lengths_and_structure() -> None:
    config = SharedPrefixConfig(num_groups=3, prompts_per_group=4, system_len=40, question_len=7)
    requests = build_shared_prefix(config, seed=1, tokens=TOKENS)
    assert len(requests) == 12
    assert all(r.prompt_len == 47 and r.max_tokens == config.output_len for r in requests)
    by_group: dict[str, set[tuple[int, ...]]] = {}
    for r in requests:
        by_group.setdefault(r.group, set()).add(r.prompt_token_ids[:40])
    assert len(by_group) == 3
    assert all(len(prefixes) == 1 for prefixes in by_group.values())  # one system prompt each
    assert len(set().union(*by_group.values())) == 3  # and the groups differ
    assert len({r.prompt_token_ids for r in requests}) == 12  # questions differ
    assert len({r.request_id for r in requests}) == 12
    assert all(TOKENS.low <= t < TOKENS.high for r in requests for t in r.prompt_token_ids)


def test_rag_lengths_chunks_and_varying_order() -> None:
    config = RagConfig(
        num_queries=30,
        num_documents=5,
        chunks_per_query=3,
        chunk_len=20,
        system_len=10,
        question_len=4,
    )
    requests = build_rag(config, seed=2, tokens=TOKENS)
    assert all(r.prompt_len == config.prompt_len == 74 for r in requests)
    system = requests[0].prompt_token_ids[:10]
    assert all(r.prompt_token_ids[:10] == system for r in requests)
    orders = [tuple(int(d) for d in r.group.removeprefix("docs-").split("-")) for r in requests]
    assert all(len(set(order)) == 3 for order in orders)  # distinct chunks per query
    assert len({frozenset(o) for o in orders}) < len({o for o in orders})  # same set, new order
    chunk_of = {}
    for r, order in zip(requests, orders, strict=True):
        for slot, document in enumerate(order):
            start = 10 + slot * 20
            chunk_of.setdefault(document, set()).add(r.prompt_token_ids[start : start + 20])
    assert all(len(chunks) == 1 for chunks in chunk_of.values())  # a document is one chunk


def test_rag_fixed_order_sorts_by_popularity() -> None:
    config = RagConfig(num_queries=10, num_documents=6, chunks_per_query=2, shuffle_chunks=False)
    for r in build_rag(config, seed=0, tokens=TOKENS):
        order = [int(d) for d in r.group.removeprefix("docs-").split("-")]
        assert order == sorted(order)


def test_zipf_weights_decrease_and_sum_to_one() -> None:
    weights = zipf_weights(5, 1.0)
    assert weights.sum() == pytest.approx(1.0)
    assert list(weights) == sorted(weights, reverse=True)
    assert weights[0] / weights[1] == pytest.approx(2.0)


def test_agent_history_grows_by_call_and_result_each_turn() -> None:
    config = AgentConfig(
        num_sessions=3,
        turns_per_session=4,
        system_len=50,
        user_len=5,
        call_len=6,
        result_len=9,
        output_len=3,
    )
    requests = build_agent(config, seed=3, tokens=TOKENS)
    assert [r.request_id for r in requests[:4]] == [
        "agent-s0-t0",
        "agent-s1-t0",
        "agent-s2-t0",
        "agent-s0-t1",
    ]  # sessions interleave
    by_id = {r.request_id: r for r in requests}
    for session in range(3):
        for turn in range(4):
            r = by_id[f"agent-s{session}-t{turn}"]
            assert r.prompt_len == config.prompt_len(turn) == 55 + 15 * turn
            if turn:
                previous = by_id[f"agent-s{session}-t{turn - 1}"].prompt_token_ids
                assert r.prompt_token_ids[: len(previous)] == previous
    starts = {r.prompt_token_ids[:50] for r in requests}
    assert len(starts) == 1  # one system prompt + tool schemas for all sessions
    assert len({by_id[f"agent-s{s}-t0"].prompt_token_ids for s in range(3)}) == 3


def test_prefix_repetition_counts() -> None:
    config = PrefixRepetitionConfig(num_prompts=10, num_prefixes=3, prefix_len=30, suffix_len=5)
    requests = build_prefix_repetition(config, seed=4, tokens=TOKENS)
    assert all(r.prompt_len == 35 for r in requests)
    groups: dict[str, set[tuple[int, ...]]] = {}
    for r in requests:
        groups.setdefault(r.group, set()).add(r.prompt_token_ids[:30])
    assert sorted(len([r for r in requests if r.group == g]) for g in groups) == [3, 3, 4]
    assert all(len(prefixes) == 1 for prefixes in groups.values())


@pytest.mark.parametrize("workload", ["shared-prefix", "rag", "agent", "prefix-repetition"])
def test_same_seed_same_requests_other_seed_differs(workload: str) -> None:
    first = build_requests(workload, 7, TOKENS)
    assert first == build_requests(workload, 7, TOKENS)
    assert first != build_requests(workload, 8, TOKENS)


def test_mixed_workload_interleaves_and_keeps_each_order() -> None:
    mixed = build_requests(
        "agent,rag", 0, TOKENS, {"num_queries": 2, "num_sessions": 1, "turns_per_session": 3}
    )
    assert [r.request_id for r in mixed] == [
        "agent-s0-t0",
        "rag-0",
        "agent-s0-t1",
        "rag-1",
        "agent-s0-t2",
    ]
    assert interleave([], []) == []


def test_overrides_apply_only_to_matching_fields() -> None:
    config = workload_config("rag", {"system_len": 9, "num_sessions": 5, "output_len": None})
    assert config.system_len == 9 and config.output_len == RagConfig().output_len


@pytest.mark.parametrize(
    ("workload", "overrides", "message"),
    [
        ("nope", {}, "unknown workload 'nope'"),
        ("rag", {"chunks_per_query": 9, "num_documents": 3}, "exceeds num_documents"),
        ("agent", {"turns_per_session": 0}, "turns_per_session must be a positive integer"),
        ("shared-prefix", {"system_len": -1}, "system_len"),
        ("trace", {}, "needs a trace FILE"),
        ("trace,rag", {}, "cannot be mixed"),
        ("", {}, "no workload"),
    ],
)
def test_bad_workloads_raise_value_error(workload: str, overrides: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        build_requests(workload, 0, TOKENS, overrides)


def test_token_range_for_small_vocab() -> None:
    tokens = TokenRange.for_vocab(384)
    assert (tokens.low, tokens.high) == (96, 384)
    with pytest.raises(ValueError):
        TokenRange(5, 5)
