"""Continuous batching over the prefix cache: admit, budget, preempt, commit. No tensors here.

Each step the scheduler (1) continues running requests — one decode token each, or the next
prefill chunk — allocating blocks and copying shared blocks on write, preempting the newest
request when the pool runs dry; (2) admits waiting requests: a prefix match reuses cached
blocks (capped so the last prompt token is always computed), a cached block that shares the
next few tokens is copied, and blocks are allocated for the first chunk; (3) after the runner
ran, commits newly filled blocks to the tree, so later requests — and this one, if
preempted — hit them; a finished or preempted request's last, partly filled block is cached
too.

With a ``TierFetcher`` (a lower KV tier: disk, shared store), a waiting request whose prompt's
next blocks the lower tier keeps is not admitted at once: its blocks are read on the fetcher's
thread while it waits (``LOADING``) and the others are scheduled; it is admitted with them in
hand. A step with nothing to run but loads waits for the first of them.

With ``SlidingSlots`` (a hybrid KV cache: sliding-window layers in a smaller slot pool), each
scheduled request holds the slots of its window's blocks and lets the blocks behind the window
go; a prefix hit is cut back to the longest prefix whose last window still has its slots; a
pool of slots too small for every running window preempts as the block pool does.
"""

from __future__ import annotations

import time
from collections import deque

from prefixcache import CacheFull, CopyOp, PrefixCache
from prefixcache.engine.engine_options import check_bool_option, check_int_option
from prefixcache.engine.request import Request, RequestStatus
from prefixcache.engine.scheduler_output import ScheduledSequence, SchedulerOutput
from prefixcache.engine.scheduling_policy import SchedulingPolicy
from prefixcache.engine.sliding_slots import SlidingSlots
from prefixcache.engine.tier_fetcher import TierFetcher

LOAD_WAIT_S = 0.05  # a step with nothing but loads to wait for waits at most this long


WAITING_STATES = (RequestStatus.WAITING, RequestStatus.LOADING, RequestStatus.PREEMPTED)


class Scheduler:
    """Owns the waiting queue and the running list; the ``PrefixCache`` owns the block ids.

    ``max_num_seqs`` and ``max_num_batched_tokens`` must be positive ints and
    ``enable_prefix_caching`` a bool (TypeError / ValueError naming the option otherwise).
    """

    def __init__(
        self,
        cache: PrefixCache,
        max_num_seqs: int,
        max_num_batched_tokens: int,
        enable_prefix_caching: bool = True,
        policy: SchedulingPolicy | None = None,
        fetcher: TierFetcher | None = None,
        sliding: SlidingSlots | None = None,
    ) -> None:
        """``fetcher`` reads the cache's lower tier ahead of admission, ``sliding`` lends the
        sliding-window layers' slots (module docstring)."""
        self.cache = cache
        self.fetcher = fetcher
        self.sliding = sliding
        self.block_size = cache.block_size
        self.max_num_seqs = check_int_option("max_num_seqs", max_num_seqs)
        self.max_num_batched_tokens = check_int_option(
            "max_num_batched_tokens", max_num_batched_tokens
        )
        self.enable_prefix_caching = check_bool_option(
            "enable_prefix_caching", enable_prefix_caching
        )
        self.policy = policy or SchedulingPolicy("fcfs")
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.num_preemptions = 0
        self.step_count = 0
        self.blocked: Request | None = None  # the request the last step could not admit
        # Requests of a step that raised, each to run its next step alone (``isolate``).
        self.isolated: list[Request] = []

    def check_invariants(self) -> None:
        """AssertionError unless: running requests are RUNNING with blocks for their computed
        tokens; waiting ones hold no block; no request is in both; isolated ones are queued
        or running."""
        bs = self.block_size
        for request in self.running:
            assert request.status is RequestStatus.RUNNING, request
            assert len(request.block_ids) >= -(-request.num_computed_tokens // bs), request
            assert request.num_committed_blocks * bs <= request.num_computed_tokens or (
                request.num_computed_tokens == 0), request
        for request in self.waiting:
            assert request.status in WAITING_STATES, request
            assert not request.block_ids, request
            assert (request.tier_fetch is not None) == (
                request.status is RequestStatus.LOADING), request
        assert not set(map(id, self.running)) & set(map(id, self.waiting))
        queued = {id(r) for r in self.running} | {id(r) for r in self.waiting}
        assert all(id(r) in queued for r in self.isolated), self.isolated
        if self.sliding is not None:
            self.sliding.check_invariants()
            for request in self.running:  # the next token's window is held
                held = set(self.sliding.held.get(request, ()))
                context = request.num_computed_tokens
                window = self.sliding.window_blocks(context, context)
                assert {request.block_ids[i] for i in window} <= held, request
            waiting = [r for r in self.waiting if r in self.sliding.held]
            assert not waiting, waiting

    # ------------------------------------------------------------------ queue
    def add(self, request: Request) -> None:
        self.waiting.append(request)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    # ------------------------------------------------------------------ step
    def schedule(self) -> SchedulerOutput:
        """Pick this step's work within the token budget and allocate its blocks."""
        self.step_count += 1
        self.blocked = None
        if self.sliding is not None:
            self.sliding.end_copies()  # the last step ran its copies
        if self.isolated:
            return self._schedule_alone(self.isolated[0])
        out = SchedulerOutput()
        budget = self.max_num_batched_tokens
        index = 0
        while index < len(self.running) and budget > 0:
            request = self.running[index]
            num_new = min(request.num_tokens - request.num_computed_tokens, budget)
            if not self._reserve_with_preemption(request, num_new, out):
                break  # the request preempted itself: it was the newest
            self._add_scheduled(out, request, num_new)
            budget -= num_new
            index += 1
        if not out.preempted:
            budget = self._admit_waiting(out, budget)
            loading = [r.tier_fetch for r in self.waiting if r.tier_fetch is not None]
            if out.is_empty and not self.running and loading:
                TierFetcher.wait_first(loading, LOAD_WAIT_S)  # nothing else to do meanwhile
                self._admit_waiting(out, budget)
        return out

    def _admit_waiting(self, out: SchedulerOutput, budget: int) -> int:
        """Admit waiting requests in the policy's order within ``budget`` tokens, past those
        still loading; returns the budget left."""
        for request in self.policy.order(self.waiting, self.cache, self.step_count):
            if budget <= 0 or len(self.running) >= self.max_num_seqs:
                break
            if self._loading(request):
                continue
            num_new = self._admit(request, budget, out)
            if num_new is None:
                self.blocked = request  # the policy's pick the pool could not hold
                break
            self.waiting.remove(request)
            self._add_scheduled(out, request, num_new)
            budget -= num_new
        return budget

    def _loading(self, request: Request) -> bool:
        """Whether ``request`` waits for a lower-tier read: one is started the first time it
        is considered if the lower tier keeps its prompt's next blocks."""
        if self.fetcher is None or not self.enable_prefix_caching:
            return False
        if request.tier_fetch is None:
            if request.tier_payloads is not None:
                return False
            lookup = self.cache.find_in_lower_tier(request.all_tokens, request.salt,
                                                   request.num_tokens - 1)  # fmt: skip
            if lookup is None:
                request.tier_payloads = {}
                return False
            request.tier_fetch = self.fetcher.submit(lookup)
            request.status = RequestStatus.LOADING
            return True
        if not request.tier_fetch.done():
            return True
        request.tier_payloads = request.tier_fetch.result()
        request.tier_fetch = None
        request.status = RequestStatus.WAITING
        return False

    def _schedule_alone(self, request: Request) -> SchedulerOutput:
        """A step of ``request`` (isolated, so waiting) and nothing else, with the whole token
        budget; running requests are preempted, newest first, while the pool (or
        ``max_num_seqs``) cannot hold it.
        If it cannot fit even so, it is ``blocked`` and the step is empty."""
        out = SchedulerOutput()
        while len(self.running) >= self.max_num_seqs or (
            num_new := self._admit(request, self.max_num_batched_tokens, out)
        ) is None:
            if not self.running:
                self.blocked = request
                return out
            victim = self.running[-1]
            self.preempt(victim)
            out.preempted.append(victim)
        self.waiting.remove(request)
        self._add_scheduled(out, request, num_new)
        return out

    def isolate(self, requests: list[Request]) -> None:
        """Requeue the running ``requests`` of a step that raised, each to run its next step
        alone, so the one that makes a step raise can be told from the others. What that step
        may have written is not trusted: only their committed blocks stay cached."""
        for request in requests:
            self.forget_unverified(request)
            if request.status is RequestStatus.RUNNING:
                self.preempt(request)
            if request not in self.isolated:
                self.isolated.append(request)

    def forget_unverified(self, request: Request) -> None:
        """After a step of ``request`` raised: tokens past its committed blocks are no longer
        known written (the step may have failed before copying or after writing garbage), so
        releasing its blocks caches none of them."""
        request.num_written_tokens = min(
            request.num_written_tokens, request.num_committed_blocks * self.block_size
        )

    def _add_scheduled(self, out: SchedulerOutput, request: Request, num_new: int) -> None:
        context = request.num_computed_tokens
        samples = context + num_new == request.num_tokens
        seq = ScheduledSequence(request, context, num_new, samples)
        (out.decodes if num_new == 1 and context > 0 else out.prefills).append(seq)

    def _reserve_with_preemption(
        self, request: Request, num_new: int, out: SchedulerOutput
    ) -> bool:
        while not self._reserve(request, num_new, out):
            victim = self.running[-1]
            self.preempt(victim)
            out.preempted.append(victim)
            if victim is request:
                return False
        return True

    def _reserve(self, request: Request, num_new: int, out: SchedulerOutput) -> bool:
        """Make room for ``num_new`` more tokens: copy a shared partial block, add new blocks."""
        bs = self.block_size
        start = request.num_computed_tokens
        try:
            if start % bs:
                slot = start // bs
                block, op = self.cache.copy_on_write(request.block_ids[slot])
                if op is not None:
                    if self.sliding is not None:
                        self.sliding.protect(op.src)
                    request.block_ids[slot] = block
                    out.copy_ops.append(op)
            need = -(-(start + num_new) // bs) - len(request.block_ids)
            if need > 0:
                request.block_ids.extend(self.cache.allocate(need))
        except CacheFull:
            return False
        return self._hold_window(request, request.block_ids, start, num_new)

    def _hold_window(self, request: Request, block_ids: list[int], start: int,
                     num_new: int) -> bool:  # fmt: skip
        """Hold the sliding slots of the blocks ``num_new`` tokens from ``start`` see; False
        when the slot pool cannot lend them (nothing held changed)."""
        if self.sliding is None:
            return True
        window = self.sliding.window_blocks(start, start + num_new)
        return self.sliding.hold(request, [block_ids[i] for i in window])

    def _admit(self, request: Request, budget: int, out: SchedulerOutput) -> int | None:
        """Match the prefix, allocate the first chunk's blocks, move to running; returns the
        chunk size, or None (nothing changed) when the pool cannot hold the chunk.

        A cached block that shares the prompt's next tokens past the full-block match (fewer
        than a block) is copied into the request's first new block, so those tokens are not
        computed again."""
        cached: list[int] = []
        num_cached = 0
        partial: int | None = None
        if self.enable_prefix_caching:
            # blocks the tiers hold past the pool's cached path come back first (the lower
            # tier's read ahead when there is a fetcher)
            fetched = None if self.fetcher is None else (request.tier_payloads or {})
            self.cache.promote(request.all_tokens, request.salt, request.num_tokens - 1,
                               fetched=fetched)  # fmt: skip
            match = self.cache.match(  # counted below, once admitted
                request.all_tokens, request.salt, max_tokens=request.num_tokens - 1,
                partial_block=True, count=False,
            )
            cached, partial = match.block_ids, match.partial_block
            num_cached = match.num_tokens + match.partial_tokens
            if self.sliding is not None:
                cached, partial, num_cached = self._usable_hit(cached, partial, num_cached)
        def first_chunk(num_cached: int) -> tuple[int, int]:  # (tokens, blocks to allocate)
            num_new = min(request.num_tokens - num_cached, budget)
            return num_new, -(-(num_cached + num_new) // self.block_size) - len(cached)

        num_new, need = first_chunk(num_cached)
        try:
            fresh = self.cache.allocate(need)
        except CacheFull:
            if partial is None:
                self.cache.release(cached)
                return None
            # the partial block's own reference may be what keeps the pool full (it is the
            # one block eviction could free): give it up and compute its tokens instead
            self.cache.release([partial])
            partial, num_cached = None, len(cached) * self.block_size
            num_new, need = first_chunk(num_cached)
            try:
                fresh = self.cache.allocate(need)
            except CacheFull:
                self.cache.release(cached)
                return None
        if partial is not None and self.sliding is not None:
            self.sliding.protect(partial)  # its slot is copied from: no fresh block takes it
        if not self._hold_window(request, cached + fresh, num_cached, num_new):
            if partial is not None and self.sliding is not None:
                self.sliding.unprotect(partial)
            self.cache.release(cached + fresh + ([] if partial is None else [partial]))
            return None
        if partial is not None:
            # the runner copies before the step writes anything, so the source may be freed
            # (even reallocated) by the time it runs
            out.copy_ops.append(CopyOp(partial, fresh[0], num_cached % self.block_size))
            self.cache.release([partial])
        request.block_ids = cached + fresh
        if request.tier_payloads:
            request.tier_payloads = {}  # in the pool now: the bytes need not stay
        if self.enable_prefix_caching and request.num_cached_tokens is None:
            # the hit rate counts each request once, at its first admission (a preempted
            # request's re-match is not a new query), and only what it uses
            self.cache.count_query(request.num_tokens, num_cached)
        request.num_computed_tokens = num_cached
        request.num_written_tokens = len(cached) * self.block_size
        request.num_committed_blocks = len(cached)
        if request.num_cached_tokens is None:
            request.num_cached_tokens = num_cached
        request.status = RequestStatus.RUNNING
        if request.metrics.first_scheduled_time is None:
            request.metrics.first_scheduled_time = time.perf_counter()
        self.running.append(request)
        return num_new

    def _usable_hit(self, cached: list[int], partial: int | None,
                    num_cached: int) -> tuple[list[int], int | None, int]:  # fmt: skip
        """A match cut back to the longest prefix whose last window has its sliding slots (the
        blocks past it released)."""
        assert self.sliding is not None
        blocks = cached + ([] if partial is None else [partial])
        usable = self.sliding.usable_prefix(blocks, num_cached)
        if usable == num_cached:
            return cached, partial, num_cached
        self.sliding.record_shortened(num_cached - usable)
        keep = usable // self.block_size
        self.cache.release(cached[keep:] + ([] if partial is None else [partial]))
        return cached[:keep], None, usable

    # ------------------------------------------------------------------ after the step
    def commit_step(self, out: SchedulerOutput) -> None:
        """Record the computed tokens and offer newly filled blocks to the prefix cache."""
        for seq in out.sequences:
            request = seq.request
            request.num_computed_tokens += seq.num_new_tokens
            request.num_written_tokens = request.num_computed_tokens
            self.commit_blocks(request)
            if request in self.isolated:  # its step ran alone and did not raise: cleared
                self.isolated.remove(request)

    def commit_blocks(self, request: Request) -> None:
        full = request.num_computed_tokens // self.block_size
        if self.enable_prefix_caching and full > request.num_committed_blocks:
            self.cache.insert(
                request.tokens[: full * self.block_size], request.block_ids[:full], request.salt
            )
        request.num_committed_blocks = max(full, request.num_committed_blocks)

    def fork(self, parent: Request, child: Request) -> None:
        """Start ``child`` on ``parent``'s blocks (shared by reference, copied on write). With
        ``max_num_seqs`` sequences running already, the child waits at the front of the queue
        instead (its blocks given back; its cached prompt is matched again on admission)."""
        self.cache.fork(parent.block_ids)
        child.block_ids = list(parent.block_ids)
        if self.sliding is not None:
            self.sliding.share(parent, child)
        child.num_computed_tokens = parent.num_computed_tokens
        child.num_written_tokens = parent.num_written_tokens
        child.num_committed_blocks = parent.num_committed_blocks
        child.num_cached_tokens = parent.num_cached_tokens
        child.status = RequestStatus.RUNNING
        self.running.append(child)
        if len(self.running) > self.max_num_seqs:
            self.running.remove(child)
            self._release_blocks(child)
            child.status = RequestStatus.WAITING
            self.waiting.appendleft(child)

    def preempt(self, request: Request) -> None:
        """Free a running request's blocks (its full blocks stay cached) and requeue it first."""
        self.running.remove(request)
        self._release_blocks(request)
        request.status = RequestStatus.PREEMPTED
        request.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(request)

    def finish(self, request: Request, reason: str) -> None:
        """End a request (stop, length, abort): release its blocks, keep its cached prefix."""
        if request.status is RequestStatus.RUNNING:
            self.running.remove(request)
        elif request.status is not RequestStatus.FINISHED and request in self.waiting:
            self.waiting.remove(request)
        request.tier_fetch = None  # a read still running is left to finish, its result unused
        request.tier_payloads = None
        self._release_blocks(request)
        if request in self.isolated:
            self.isolated.remove(request)
        request.status = RequestStatus.FINISHED
        request.finish_reason = reason
        if request.metrics.finished_time is None:  # an abort: no final token set it
            request.metrics.finished_time = time.perf_counter()

    def _release_blocks(self, request: Request) -> None:
        """Release a request's blocks; its last, partly filled block stays cached (a later
        prompt that goes on from where it stopped copies it instead of recomputing it)."""
        written = request.num_written_tokens
        if self.enable_prefix_caching and written % self.block_size and request.block_ids:
            self.cache.insert_partial(
                request.tokens[:written], request.block_ids[written // self.block_size],
                request.salt,
            )
        if request.block_ids:
            self.cache.release(request.block_ids)
        if self.sliding is not None:
            self.sliding.release(request)
        request.block_ids = []
        request.num_computed_tokens = 0
        request.num_written_tokens = 0
        request.num_committed_blocks = 0
