"""The n samples of one user request, as the engine tracks them, and their pooled metrics."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from prefixcache.engine.outputs import RequestMetricsView
from prefixcache.engine.request import Request
from prefixcache.engine.sampling_params import SamplingParams
from prefixcache.engine.stop_checker import SequenceText


@dataclass
class Sample:
    """One of a request's n samples: its sequence, its text so far, its private generator."""

    request: Request
    text: SequenceText
    generator: torch.Generator | None


class RequestGroup:
    """The n samples of one user request (sample 0 is admitted; the others fork from it)."""

    def __init__(self, request_id: str, prompt: str | None, params: SamplingParams) -> None:
        self.request_id = request_id
        self.prompt = prompt
        self.params = params
        self.samples: list[Sample] = []
        self.error: str | None = None
        self.error_kind: str | None = None
        self.aborted = False

    @property
    def finished(self) -> bool:
        if self.error is not None or self.aborted:
            return True
        return len(self.samples) == self.params.n and all(
            s.request.is_finished for s in self.samples
        )


def group_metrics(samples: list[Request]) -> RequestMetricsView:
    """A request's metrics over all its samples (``n > 1``): ``ttft`` and ``queue`` from its
    first sample (the others fork from it), ``e2e`` to the last sample's finish (None until
    every sample finished), ``tpot`` the mean gap after each sample's first token, pooled."""
    first = samples[0].metrics
    ends = [request.metrics.finished_time for request in samples]
    decode_time, decode_tokens = 0.0, 0
    for request in samples:
        gap = request.metrics.tpot(request.num_output_tokens)
        if gap is not None:
            decode_time += gap * (request.num_output_tokens - 1)
            decode_tokens += request.num_output_tokens - 1
    scheduled = first.first_scheduled_time
    return RequestMetricsView(
        ttft=first.ttft,
        tpot=decode_time / decode_tokens if decode_tokens else None,
        e2e=None if None in ends else max(ends) - first.arrival_time,  # type: ignore[type-var]
        queue=None if scheduled is None else scheduled - first.arrival_time,
    )
