"""The step loop: requests in, scheduler -> runner -> sampler -> stop checks, outputs out.

Single-threaded by design: ``LLM`` drives it synchronously, ``AsyncLLM`` from one worker.

No request can stop the engine: a step that raises is contained. A failure while sampling
or checking one request's token fails that request alone. A forward that raises fails its
request if the step held only one; otherwise every request of the step is requeued to run
its next step alone (``Scheduler.isolate``), so the one that makes a forward raise fails on
its own and the others go on. A failed request ends with ``error_kind`` ``INTERNAL_ERROR``,
its blocks released (none of what the failed step wrote is cached); the failure is logged
with its traceback and counted (``num_request_errors``, ``num_failed_steps``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence

import numpy as np
import torch

from prefixcache import PrefixCache
from prefixcache.engine.logits_processors import process_logits, rows_to_process
from prefixcache.engine.logprobs import raw_logprobs, token_logprob
from prefixcache.engine.model_runner import ModelRunner
from prefixcache.engine.outputs import (
    INTERNAL_ERROR,
    KV_EXHAUSTED,
    CompletionOutput,
    RequestOutput,
)
from prefixcache.engine.request import Request
from prefixcache.engine.request_group import RequestGroup, Sample, group_metrics
from prefixcache.engine.sampler import make_generator, sample_token
from prefixcache.engine.sampling_params import SamplingParams
from prefixcache.engine.scheduler import Scheduler
from prefixcache.engine.scheduler_output import SchedulerOutput
from prefixcache.engine.stop_checker import SequenceText, check_stop, stop_string_holdback
from prefixcache.engine.structured_output import GrammarCompiler, GrammarMasks
from prefixcache.ttl_pins import TtlPins

logger = logging.getLogger(__name__)


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
        grammars: GrammarCompiler | None = None,
        vocab_size: int = 0,
        ttl_pins: TtlPins | None = None,
    ) -> None:
        """``prefix_stable_decode``: ``decode`` is byte-level (``Tokenizer.decode_concatenates``),
        so a request's text is kept up to date by decoding only its new tokens
        (``SequenceText``). ``grammars`` compiles requests' structured outputs (over
        ``vocab_size`` logits). ``ttl_pins`` expire as steps run."""
        self.grammars = grammars
        self.vocab_size = vocab_size
        self.ttl_pins = ttl_pins
        self.scheduler = scheduler
        self.runner = runner
        self.cache: PrefixCache = scheduler.cache
        self.decode = decode
        self.eos_token_ids = eos_token_ids
        self.max_model_len = max_model_len
        self.prefix_stable_decode = prefix_stable_decode
        self.groups: dict[str, RequestGroup] = {}
        self._by_request: dict[Request, RequestGroup] = {}
        self.num_finished = 0
        self.num_request_errors = 0  # requests failed by a step that raised
        self.num_failed_steps = 0  # steps whose forward raised

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
        group = RequestGroup(request_id, prompt, params)
        request = Request(request_id, prompt_token_ids, params, salt, arrival_time)
        if params.structured is not None:
            if self.grammars is None:
                raise ValueError("this engine has no grammar compiler for structured outputs")
            request.matcher = self.grammars.matcher(params.structured)
        group.samples.append(
            Sample(request, self._new_text(), make_generator(params.seed))
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
        self._persist_committed()  # blocks cached outside a step (none are written before this)
        if self.ttl_pins is not None:
            self.ttl_pins.expire()  # before the schedule: what expired may be evicted now
        out = self.scheduler.schedule()
        self._move_tier_blocks()
        touched: dict[str, RequestGroup] = {}
        if out.is_empty:
            self._fail_unschedulable(touched)
        else:
            self._run_step(out, touched)
        return [
            self._safe_snapshot(group)
            for group in touched.values()
            if group.finished or not finished_only
        ]

    def _safe_snapshot(self, group: RequestGroup) -> RequestOutput:
        """``_snapshot``, failing the group instead if its text cannot be decoded."""
        try:
            return self._snapshot(group)
        except Exception as error:
            logger.exception("request %s failed while decoding its text", group.request_id)
            self._fail(group, INTERNAL_ERROR, f"decoding the output failed: {error!r}")
            return self._snapshot(group)  # every sample finished: no decode left to fail

    def _move_tier_blocks(self) -> None:
        """The copies the schedule queued between the pool and the host tier (blocks it
        evicted, blocks it promoted), before anything writes into the pool."""
        cache = self.scheduler.cache
        writebacks, loads = cache.take_tier_copies()
        disk_loads = cache.take_disk_loads()
        if writebacks or loads or disk_loads:
            self.runner.apply_tier_copies(writebacks, loads, disk_loads)

    def _persist_committed(self) -> None:
        """Blocks the cache took in since the last call, to the disk tier (bytes read now)."""
        blocks = self.scheduler.cache.take_persist()
        if blocks:
            self.runner.persist(blocks)

    def _run_step(self, out: SchedulerOutput, touched: dict[str, RequestGroup]) -> None:
        """Forward ``out``, commit its blocks, sample and check each sampled row; a failure
        is contained (module docstring)."""
        sampled = [seq.request for seq in out.sequences if seq.samples]
        groups = [self._by_request[request] for request in sampled]
        logits: torch.Tensor | None = None  # [num_sampled, vocab], when a row samples
        logprobs: dict[int, torch.Tensor] = {}  # row -> [vocab] raw log-softmax
        try:
            if all(g.params.greedy and not g.params.needs_logits for g in groups):
                greedy = self.runner.execute_greedy(out)  # [num_sampled] token ids
            else:
                constrained = [(row, r.matcher, r.params.greedy) for row, r in enumerate(sampled)
                               if r.matcher is not None]  # fmt: skip
                # the grammars' masks are computed while the model runs the step
                masks = GrammarMasks(constrained, self.vocab_size) if constrained else None
                logits = self.runner.execute(out)
                logprobs = raw_logprobs(logits, sampled)  # before any processing
                if rows := rows_to_process(sampled):
                    with torch.inference_mode():  # the runner's logits are inference tensors
                        processed = logits[rows]
                        process_logits(processed, [sampled[r] for r in rows],
                                       self.eos_token_ids)
                        logits[rows] = processed
                        if masks is not None:
                            masks.apply(logits)
                # One argmax over the batch instead of one per greedy row.
                if any(group.params.greedy for group in groups):
                    greedy = logits.argmax(dim=-1).tolist()
                else:
                    greedy = [-1] * len(groups)  # unused: every row samples
        except Exception as error:
            self._contain_failed_forward(out, error, touched)
            return
        self.scheduler.commit_step(out)
        self._persist_committed()
        now = time.perf_counter()
        for row, (request, group) in enumerate(zip(sampled, groups, strict=True)):
            touched[group.request_id] = group
            if group.error is not None:  # an earlier row of the group failed it this step
                continue
            row_logits = None if logits is None else logits[row]
            try:
                self._advance(group, request, row_logits, greedy[row], now, logprobs.get(row))
            except Exception as error:
                logger.exception("request %s failed while sampling", group.request_id)
                self._fail(group, INTERNAL_ERROR, f"sampling failed: {error!r}")

    def _contain_failed_forward(
        self, out: SchedulerOutput, error: Exception, touched: dict[str, RequestGroup]
    ) -> None:
        """A forward raised: fail its request if it was the step's only one, else run each
        of the step's requests alone next (the scheduler's isolation)."""
        self.num_failed_steps += 1
        requests = [seq.request for seq in out.sequences]
        groups = {id(g): g for g in (self._by_request[r] for r in requests)}.values()
        if len(groups) > 1:
            logger.warning("a step of %d requests raised %r; each runs its next step alone",
                           len(groups), error, exc_info=error)
            self.scheduler.isolate(requests)
            return
        (group,) = groups
        logger.error("request %s failed: its step raised", group.request_id, exc_info=error)
        for request in requests:
            self.scheduler.forget_unverified(request)
        self._fail(group, INTERNAL_ERROR, f"the model step failed: {error!r}")
        touched[group.request_id] = group

    def _fail(self, group: RequestGroup, kind: str, message: str) -> None:
        """End ``group`` with an error: every unfinished sample aborted, its blocks released."""
        group.error, group.error_kind = message, kind
        if kind == INTERNAL_ERROR:
            self.num_request_errors += 1
        for sample in group.samples:  # all of them: the group's snapshot ends its bookkeeping
            if not sample.request.is_finished:
                self.scheduler.finish(sample.request, "abort")

    def _advance(
        self,
        group: RequestGroup,
        request: Request,
        logits: torch.Tensor | None,  # [vocab] float32; None on an all-greedy step
        greedy_token: int,  # the row's argmax token (greedy requests only)
        now: float,
        logprobs: torch.Tensor | None = None,  # [vocab] raw log-softmax, when asked for
    ) -> None:
        sample = next(s for s in group.samples if s.request is request)
        children: list[Sample] = []
        if request.num_output_tokens == 0 and request.sample_index == 0 and group.params.n > 1:
            children = [self._fork(group, request, index) for index in range(1, group.params.n)]
        for current in [sample, *children]:
            if group.params.greedy:
                token = greedy_token
            else:
                assert logits is not None  # a sampling row makes the step hand logits out
                token = sample_token(logits, group.params, current.generator)
            if logprobs is not None:
                top = group.params.logprobs or 0
                current.request.logprobs.append(token_logprob(logprobs, token, top))
            self._append(current, token, now)

    def _fork(self, group: RequestGroup, parent: Request, index: int) -> Sample:
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
        if parent.matcher is not None:  # forked before the parent's first token: at its start
            child.matcher = parent.matcher.deep_copy()
        self.scheduler.fork(parent, child)
        child_sample = Sample(child, self._new_text(), make_generator(group.params.seed, index))
        group.samples.append(child_sample)
        self._by_request[child] = group
        return child_sample

    def _append(self, sample: Sample, token: int, now: float) -> None:
        request = sample.request
        request.append_token(token)
        if request.metrics.first_token_time is None:
            request.metrics.first_token_time = now
        request.metrics.last_token_time = now
        matcher = request.matcher
        if matcher is not None and not matcher.consume_token(token):
            logger.warning("request %s: its structured output cannot take token %d: %s",
                           request.request_id, token, matcher.get_error())  # fmt: skip
        reason = check_stop(request, sample.text, self.eos_token_ids, self.max_model_len)
        if reason is None and matcher is not None and (matcher.is_stopped()
                                                       or matcher.is_error()):  # fmt: skip
            reason = "stop"  # the grammar is complete (or cannot go on): nothing may follow
            sample.text.update(request)
        if reason is not None:
            request.metrics.finished_time = now
            self.scheduler.finish(request, reason)
            if not isinstance(request.stop_reason, str):
                sample.text.update(request)
            self.num_finished += 1

    def _fail_unschedulable(self, touched: dict[str, RequestGroup]) -> None:
        """Nothing could run: the request the policy picked cannot fit in the pool even when
        alone (pins hold the rest); it fails, and the others are tried next step."""
        if self.scheduler.running or self.scheduler.blocked is None:
            return
        request = self.scheduler.blocked  # the policy's pick, not always the oldest request
        group = self._by_request[request]
        self._fail(group, KV_EXHAUSTED,
                   f"request needs more KV blocks than the pool can free "
                   f"({self.cache.stats()['free']} free of {self.cache.num_blocks})")
        touched[group.request_id] = group

    def _snapshot(self, group: RequestGroup) -> RequestOutput:
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
                    list(request.logprobs) if group.params.logprobs is not None else None,
                )
            )
        finished = group.finished
        if finished:
            self.groups.pop(group.request_id, None)
            for sample in group.samples:
                self._by_request.pop(sample.request, None)
        view = group_metrics([sample.request for sample in group.samples])
        return RequestOutput(
            group.request_id,
            first.prompt_token_ids,
            outputs,
            first.num_cached_tokens or 0,
            finished,
            view,
            group.prompt,
            group.error,
            group.error_kind,
        )
