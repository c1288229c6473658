"""Metric math on synthetic timings, SLO parsing, arrival schedules and load modes."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from prefixcache.integrations.bench.bench_request import BenchRequest
from prefixcache.integrations.bench.load_generator import (
    LoadConfig,
    arrival_offsets,
    run_load,
    schedule_for,
)
from prefixcache.integrations.bench.metrics import (
    Slo,
    engine_ttft_agreement,
    latency_stats,
    speedups,
    summarize,
)
from prefixcache.integrations.bench.request_result import RequestResult


def timed(
    start: float,
    token_times: list[float],
    end: float,
    prompt: int = 100,
    cached: int | None = None,
    engine_ttft: float | None = None,
) -> RequestResult:
    result = RequestResult(
        "r",
        "w",
        "",
        prompt,
        len(token_times),
        start=start,
        end=end,
        token_times=token_times,
        output_tokens=len(token_times),
        cached_tokens=cached,
        engine_ttft=engine_ttft,
    )
    return result


def test_per_request_figures() -> None:
    result = timed(10.0, [10.2, 10.3, 10.5], 10.5)
    assert result.success
    assert result.ttft == pytest.approx(0.2)
    assert result.tpot == pytest.approx(0.15)  # (10.5 - 10.2) / 2
    assert result.itls == pytest.approx([0.1, 0.2])
    assert result.e2el == pytest.approx(0.5)
    one_token = timed(0.0, [1.0], 1.0)
    assert one_token.tpot is None and one_token.itls == []
    failed = RequestResult("f", "w", "", 10, 4, start=1.0, error="HTTP 500: boom")
    assert not failed.success and failed.ttft is None


def test_summary_on_synthetic_timings() -> None:
    results = [
        timed(0.0, [0.1, 0.2], 0.2, prompt=100, cached=0, engine_ttft=0.09),
        timed(1.0, [1.3, 1.4], 1.4, prompt=100, cached=50, engine_ttft=0.28),
        timed(2.0, [2.5, 2.6], 2.6, prompt=200, cached=100, engine_ttft=0.5),
        RequestResult("bad", "w", "", 80, 2, start=3.0, error="ConnectError: refused"),
        RequestResult("bad2", "w", "", 80, 2, start=3.0, error="timeout after 1 s"),
    ]
    summary = summarize(results, duration_s=4.0, slo=Slo(ttft_ms=350))
    assert (summary["completed"], summary["failed"], summary["num_prompts"]) == (3, 2, 5)
    assert summary["total_input_tokens"] == 400 and summary["total_output_tokens"] == 6
    assert summary["request_throughput"] == pytest.approx(0.75)
    assert summary["output_throughput"] == pytest.approx(1.5)
    assert summary["total_token_throughput"] == pytest.approx(101.5)
    assert summary["request_goodput"] == pytest.approx(0.5)  # ttft 100 and 300 ms meet 350
    assert summary["mean_ttft_ms"] == pytest.approx(300.0)
    assert summary["median_ttft_ms"] == pytest.approx(300.0)
    assert summary["p90_ttft_ms"] == pytest.approx(460.0)  # numpy linear interpolation
    assert summary["std_ttft_ms"] == pytest.approx(np.std([100, 300, 500]))
    assert summary["mean_tpot_ms"] == pytest.approx(100.0)
    assert summary["mean_itl_ms"] == pytest.approx(100.0)
    assert summary["mean_e2el_ms"] == pytest.approx(400.0)
    assert summary["prefix_cache_hit_rate"] == pytest.approx(150 / 400)
    assert summary["mean_ttft_client_minus_engine_ms"] == pytest.approx(10.0)
    assert summary["max_abs_ttft_client_minus_engine_ms"] == pytest.approx(20.0)
    assert summary["errors_by_kind"] == {"ConnectError": 1, "timeout after 1 s": 1}
    assert summary["peak_kv_usage"] is None


def test_empty_and_unreported_figures_are_none() -> None:
    summary = summarize([timed(0.0, [0.1], 0.1)], duration_s=1.0)
    assert summary["prefix_cache_hit_rate"] is None  # no cached_tokens reported
    assert summary["mean_tpot_ms"] is None and summary["request_goodput"] is None
    assert latency_stats("x", [])["p99_x_ms"] is None
    assert engine_ttft_agreement([])["mean_ttft_client_minus_engine_ms"] is None
    assert summarize([], 0.0)["request_throughput"] == 0.0


def test_slo_parse_and_check() -> None:
    slo = Slo.parse("ttft:250, tpot:50")
    assert slo.as_dict() == {"ttft_ms": 250.0, "tpot_ms": 50.0}
    assert slo.met_by(timed(0.0, [0.2, 0.25], 0.25))
    assert not slo.met_by(timed(0.0, [0.2, 0.3], 0.3))  # tpot 100 ms
    assert not slo.met_by(timed(0.0, [0.3], 0.3))  # ttft 300 ms
    for bad in ("ttft", "itl:5", "ttft:x", "ttft:0", ""):
        with pytest.raises(ValueError):
            Slo.parse(bad)


def test_speedups_compare_with_the_baseline() -> None:
    base = summarize([timed(0.0, [0.4, 0.5], 0.5)], 1.0)
    fast = summarize([timed(0.0, [0.1, 0.2], 0.2)], 0.5)
    ratios = speedups(base, fast)
    assert ratios["mean_ttft"] == pytest.approx(4.0)
    assert ratios["mean_e2el"] == pytest.approx(2.5)
    assert ratios["request_throughput"] == pytest.approx(2.0)


def test_arrival_offsets_are_seeded_with_the_right_mean() -> None:
    offsets = arrival_offsets(4001, rate=20.0, burstiness=1.0, seed=3)
    assert offsets[0] == 0.0 and np.all(np.diff(offsets) >= 0)
    assert np.mean(np.diff(offsets)) == pytest.approx(0.05, rel=0.05)
    assert np.array_equal(offsets, arrival_offsets(4001, 20.0, 1.0, 3))
    bursty = np.diff(arrival_offsets(4001, 20.0, 0.25, 3))
    assert np.std(bursty) > 1.5 * np.std(np.diff(offsets))  # CV 2 vs 1


def requests(count: int, timestamps: list[float] | None = None) -> list[BenchRequest]:
    return [
        BenchRequest(
            f"r{i}", (1, 2), 1, "w", timestamp=None if timestamps is None else timestamps[i]
        )
        for i in range(count)
    ]


def test_schedule_modes() -> None:
    assert schedule_for(requests(3), LoadConfig()) is None
    assert list(schedule_for(requests(3, [5.0, 5.5, 7.0]), LoadConfig())) == [0.0, 0.5, 2.0]
    assert schedule_for(requests(3, [5.0, 5.5, 7.0]), LoadConfig(use_timestamps=False)) is None
    assert len(schedule_for(requests(3), LoadConfig(request_rate=2.0))) == 3
    for bad in ({"concurrency": 0}, {"request_rate": 0.0}, {"burstiness": 0.0}):
        with pytest.raises(ValueError):
            LoadConfig(**bad)
    timed = requests(3, [5.0, 5.5, 7.0])
    assert LoadConfig().describe(timed) == "at the trace's timestamps"
    assert LoadConfig(concurrency=2).describe(timed) == "at the trace's timestamps, max 2 in flight"
    assert LoadConfig(use_timestamps=False).describe(timed) == "sequential"
    assert LoadConfig().describe(requests(3)) == "sequential"


class GatedSender:
    """A fake target: each request waits on an event, so tests control completion order."""

    def __init__(self) -> None:
        self.in_flight = 0
        self.peak = 0
        self.sent: list[str] = []

    async def __call__(self, request: BenchRequest) -> RequestResult:
        self.in_flight += 1
        self.peak = max(self.peak, self.in_flight)
        self.sent.append(request.request_id)
        for _ in range(3):
            await asyncio.sleep(0)  # let the other workers run
        self.in_flight -= 1
        result = RequestResult(
            request.request_id,
            "w",
            "",
            2,
            1,
            start=1.0,
            end=2.0,
            token_times=[1.5],
            output_tokens=1,
        )
        return result


@pytest.mark.parametrize(
    ("config", "peak"),
    [
        (LoadConfig(), 1),
        (LoadConfig(concurrency=3), 3),
        (LoadConfig(request_rate=1e6), 8),
        (LoadConfig(request_rate=1e6, concurrency=2), 2),
    ],
)
def test_load_modes_bound_what_is_in_flight(config: LoadConfig, peak: int) -> None:
    sender = GatedSender()
    results = asyncio.run(run_load(requests(8), sender, config, asyncio.Event()))
    assert [r.request_id for r in results] == [f"r{i}" for i in range(8)]
    assert sender.peak == peak
    assert sorted(sender.sent) == sorted(f"r{i}" for i in range(8))


def test_stop_returns_what_finished_so_far() -> None:
    async def scenario() -> tuple[list[RequestResult], list[str]]:
        stop = asyncio.Event()
        sender = GatedSender()
        finished: list[str] = []

        def on_result(result: RequestResult) -> None:
            finished.append(result.request_id)
            if len(finished) == 2:
                stop.set()

        results = await run_load(requests(6), sender, LoadConfig(), stop, on_result)
        return results, sender.sent

    results, sent = asyncio.run(scenario())
    assert [r.request_id for r in results] == ["r0", "r1"]
    assert len(sent) <= 3  # at most the one in flight when the stop came
