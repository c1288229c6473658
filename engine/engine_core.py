"""The step loop: requests in, scheduler -> runner -> sampler -> stop checks, outputs out.

Single-threaded by design: ``LLM`` drives it synchronously, ``AsyncLLM`` from one worker.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from prefixcache import PrefixCache
from prefixcache.engine.model_runner import ModelRunner
from prefixcache.engine.outputs import CompletionOutput, RequestMetricsView, RequestOutput
from prefixcache.engine.request import Request
from prefixcache.engine.sampler import make_generator, sample_token
from prefixcache.engine.sampling_params import SamplingParams
from prefixcache.engine.scheduler import Scheduler
from prefixcache.engine.stop_checker import SequenceText, check_stop, stop_string_holdback


@dataclass
class _Sample:
    request: Request
    text: SequenceText
    generator: torch.Generator | None


class _RequestGroup:
    """The n samples of one user request (sample 0 is admitted; the others fork from it)."""

    def __init__(self, request_id: str, prompt: str | None, params: SamplingParams) -> None:
        self.request_id = request_id
        self.prompt = prompt
        self.params = params
        self.samples: list[_Sample] = []
        self.error: str | None = None
        self.aborted = False

    @property
    def finished(self) -> bool:
        if self.error is not None or self.aborted:
            return True
        return len(self.samples) == self.params.n and all(
            s.request.is_finished for s in self.samples
        )


class EngineCore:
    """Owns the scheduler and the runner; every block a request takes is released on finish."""

    def __init__(
        self,
        scheduler: Scheduler,
        runner: ModelRunner,
        decode: Callable[[list[int]], str],
        eos_token_ids: tuple[int, ...],
        max_model_len: int,
        prefix_stable_decode: bool = False,
    ) -> None:
        """``prefix_stable_decode``: ``decode`` is byte-level (``Tokenizer.decode_concatenates``),
        so a request's text is kept up to date by decoding only its new tokens
        (``SequenceText``)."""
        self.scheduler = scheduler
        self.runner = runner
        self.cache: PrefixCache = scheduler.cache
        self.decode = decode
        self.eos_token_ids = eos_token_ids
        self.max_model_len = max_model_len
        self.prefix_stable_decode = prefix_stable_decode
        self.groups: dict[str, _RequestGroup] = {}
        self._by_request: dict[Request, _RequestGroup] = {}
        self.num_finished = 0

    def add_request(
        self,
        request_id: str,
        prompt_token_ids: Sequence[int] | np.ndarray,
        params: SamplingParams,
        salt: str | None = None,
        prompt: str | None = None,
        arrival_time: float | None = None,
    ) -> None:
        """Queue a validated request (the caller checked lengths and token ids)."""
        if request_id in self.groups:
            raise ValueError(f"request id {request_id!r} is already in use")
        group = _RequestGroup(request_id, prompt, params)
        request = Request(request_id, prompt_token_ids, params, salt, arrival_time)
        group.samples.append(
            _Sample(request, self._new_text(), make_generator(params.seed))
        )
        self.groups[request_id] = group
        self._by_request[request] = group
        self.scheduler.add(request)

    def _new_text(self) -> SequenceText:
        return SequenceText(self.decode, self.prefix_stable_decode)

    def abort(self, request_id: str) -> RequestOutput | None:
        """Finish a request now and free its blocks; returns its final state (finish reason
        "abort" on every unfinished sample), or None if it is unknown or already done."""
        group = self.groups.get(request_id)
        if group is None:
            return None
        for sample in group.samples:
            if not sample.request.is_finished:
                self.scheduler.finish(sample.request, "abort")
        group.aborted = True
        return self._snapshot(group)

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished()

    def step(self, finished_only: bool = False) -> list[RequestOutput]:
        """Run one scheduler step; returns the state of every request that changed, or, with
        ``finished_only``, of those that finished (the others' text is then not decoded: a
        caller that does not stream skips a decode of each running request's output a step)."""
        out = self.scheduler.schedule()
        touched: dict[str, _RequestGroup] = {}
        if out.is_empty:
            self._fail_unschedulable(touched)
        else:
            sampled = [seq.request for seq in out.sequences if seq.samples]
            groups = [self._by_request[request] for request in sampled]
            logits: torch.Tensor | None = None  # [num_sampled, vocab], when a row samples
            if all(group.params.greedy for group in groups):
                greedy = self.runner.execute_greedy(out)  # [num_sampled] token ids
            else:
                logits = self.runner.execute(out)
                # One argmax over the batch instead of one per greedy row.
                if any(group.params.greedy for group in groups):
                    greedy = logits.argmax(dim=-1).tolist()
                else:
                    greedy = [-1] * len(groups)  # unused: every row samples
            self.scheduler.commit_step(out)
            now = time.perf_counter()
            for row, (request, group) in enumerate(zip(sampled, groups, strict=True)):
                row_logits = None if logits is None else logits[row]
                self._advance(group, request, row_logits, greedy[row], now)
                touched[group.request_id] = group
        return [
            self._snapshot(group)
            for group in touched.values()
            if group.finished or not finished_only
        ]

    def _advance(
        self,
        group: _RequestGroup,
        request: Request,
        logits: torch.Tensor | None,  # [vocab] float32; None on an all-greedy step
        greedy_token: int,  # the row's argmax token (greedy requests only)
        now: float,
    ) -> None:
        sample = next(s for s in group.samples if s.request is request)
        children: list[_Sample] = []
        if request.num_output_tokens == 0 and request.sample_index == 0 and group.params.n > 1:
            children = [self._fork(group, request, index) for index in range(1, group.params.n)]
        for current in [sample, *children]:
            if group.params.greedy:
                token = greedy_token
            else:
                assert logits is not None  # a sampling row makes the step hand logits out
                token = sample_token(logits, group.params, current.generator)
            self._append(current, token, now)

    def _fork(self, group: _RequestGroup, parent: Request, index: int) -> _Sample:
        """Sample ``index`` of ``group`` starts on the parent's prompt blocks, shared."""
        child = Request(
            f"{group.request_id}#{index}",
            parent.prompt_token_ids,
            group.params,
            parent.salt,
            parent.metrics.arrival_time,
            index,
        )
        child.metrics.first_scheduled_time = parent.metrics.first_scheduled_time
        self.scheduler.fork(parent, child)
        child_sample = _Sample(child, self._new_text(), make_generator(group.params.seed, index))
        group.samples.append(child_sample)
        self._by_request[child] = group
        return child_sample

    def _append(self, sample: _Sample, token: int, now: float) -> None:
        request = sample.request
        request.append_token(token)
        if request.metrics.first_token_time is None:
            request.metrics.first_token_time = now
        request.metrics.last_token_time = now
        reason = check_stop(request, sample.text, self.eos_token_ids, self.max_model_len)
        if reason is not None:
            request.metrics.finished_time = now
            self.scheduler.finish(request, reason)
            if not isinstance(request.stop_reason, str):
                sample.text.update(request)
            self.num_finished += 1

    def _fail_unschedulable(self, touched: dict[str, _RequestGroup]) -> None:
        """Nothing could run: the request the policy picked cannot fit in the pool even when
        alone (pins hold the rest); it fails, and the others are tried next step."""
        if self.scheduler.running or self.scheduler.blocked is None:
            return
        request = self.scheduler.blocked  # the policy's pick, not always the oldest request
        group = self._by_request[request]
        group.error = (
            f"request needs more KV blocks than the pool can free "
            f"({self.cache.stats()['free']} free of {self.cache.num_blocks})"
        )
        for sample in group.samples:  # all of them: the group's snapshot ends its bookkeeping
            if not sample.request.is_finished:
                self.scheduler.finish(sample.request, "abort")
        touched[group.request_id] = group

    def _snapshot(self, group: _RequestGroup) -> RequestOutput:
        first = group.samples[0].request
        outputs = []
        for index, sample in enumerate(group.samples):
            request = sample.request
            if request.is_finished:
                text = sample.text.text
            else:  # a tail that may be the start of a stop string waits for the next steps
                text = sample.text.update(request)
                text = text[: max(0, len(text) - stop_string_holdback(group.params))]
            outputs.append(
                CompletionOutput(
                    index,
                    text,
                    request.output_token_ids,
                    request.finish_reason,
                    request.stop_reason,
                )
            )
        finished = group.finished
        if finished:
            self.groups.pop(group.request_id, None)
            for sample in group.samples:
                self._by_request.pop(sample.request, None)
        view = _group_metrics([sample.request for sample in group.samples])
        return RequestOutput(
            group.request_id,
            first.prompt_token_ids,
            outputs,
            first.num_cached_tokens or 0,
            finished,
            view,
            group.prompt,
            group.error,
        )


def _group_metrics(samples: list[Request]) -> RequestMetricsView:
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
