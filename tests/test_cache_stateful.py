"""Stateful property test: PrefixCache against the naive reference model.

A hypothesis state machine drives a small pool (8-40 blocks, block size 2-4, three token
values, two salts) through request lifecycles and every raw operation, bad inputs included.
After each step it checks the cache's own invariants, the stats, the cached set (lookups of
every cached leaf and of every block just evicted), the events ledger and the ref counts
against the reference.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any, ClassVar

import hypothesis.strategies as st
import numpy as np
from cache_reference_model import Key, ReferenceCache
from hypothesis import HealthCheck, settings
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from prefixcache import BlockRemoved, BlockStored, CacheFull, PrefixCache

VOCAB = 3
MAX_PROMPT_BLOCKS = 5
SALTS: tuple[str | None, ...] = (None, "tenant-b")
FORMS = st.sampled_from(["list", "int32", "int64"])
PROMPT_PLAN = st.tuples(
    st.integers(0, 3).map(bool),  # reuse a recent prompt (3 in 4)
    st.integers(0, 11),  # which recent prompt
    st.integers(0, 31),  # where to cut it (half the time: keep it whole)
    st.integers(0, 7),  # salt: keep the old one (6 in 8) or pick one
    st.lists(st.integers(0, VOCAB - 1), max_size=6),  # tokens appended
)
BAD_TOKENS: tuple[object, ...] = (
    [0, 1.0, 2],
    [0, "1"],
    [True, 0],
    [[0, 1], [1, 2]],
    np.array([0.0, 1.0]),
    np.array([True, False]),
    [0, -1, 2],
    [0, 2**31],
    np.array([1, 2**31], dtype=np.int64),
    np.array([-3, 1], dtype=np.int32),
)


class CacheMachine(RuleBasedStateMachine):
    """Drives PrefixCache and ReferenceCache side by side."""

    block_hasher: ClassVar[Callable[[Any, int], int] | None] = None
    exact: ClassVar[bool] = True
    predict_order: ClassVar[bool] = False
    """Check the exact eviction choice (priorities then follow the salt, so none is ambiguous)."""

    def __init__(self) -> None:
        super().__init__()
        self.cache: PrefixCache | None = None
        self.ref: ReferenceCache
        self.held: list[list[int]] = []
        self.prompts: list[tuple[list[int], str | None]] = []
        self.ledger: Counter[int] = Counter()
        self.hash_memo: dict[Key, int] = {}
        self.steps = 0
        self.last_refs: dict[int, int] = {}

    @initialize(num_blocks=st.integers(8, 40), block_size=st.integers(2, 4))
    def setup(self, num_blocks: int, block_size: int) -> None:
        """Build the cache under test and its reference."""
        hasher = type(self).block_hasher
        self.cache = PrefixCache(
            num_blocks, block_size=block_size, enable_events=True, block_hasher=hasher
        )
        self.ref = ReferenceCache(
            num_blocks,
            block_size,
            exact=self.exact,
            cache_full=CacheFull,
            predict_order=self.predict_order,
        )

    # ------------------------------------------------------------- drawing
    def draw_prompt(self, data: st.DataObject) -> tuple[list[int], str | None]:
        """A prompt and its salt, mostly repeating or extending a recent one."""
        reuse, which, cut_code, salt_code, extra = data.draw(PROMPT_PLAN, label="prompt")
        base: list[int] = []
        salt = SALTS[salt_code % len(SALTS)]
        recent = self.prompts[-12:]
        if recent and reuse:
            old, old_salt = recent[which % len(recent)]
            # Mostly the whole earlier prompt, else a random cut of it.
            base = old if cut_code < 16 else old[: (cut_code - 16) % (len(old) + 1)]
            if salt_code < 6:
                salt = old_salt
        tokens = (base + extra[: self.ref.block_size + 2])[
            : MAX_PROMPT_BLOCKS * self.ref.block_size + 1
        ]
        self.prompts.append((tokens, salt))
        return tokens, salt

    def as_input(self, data: st.DataObject, tokens: list[int]) -> list[int] | np.ndarray:
        """The same tokens as a list or a 1-D numpy array."""
        form = data.draw(FORMS, label="form")
        return list(tokens) if form == "list" else np.array(tokens, dtype=form)

    def draw_priority(self, data: st.DataObject, salt: str | None) -> int:
        """Any small priority, or one fixed per salt when the eviction order is checked."""
        if self.predict_order:
            return SALTS.index(salt)
        return data.draw(st.integers(0, 2), label="priority")

    def held_blocks(self) -> list[int]:
        """Every block the test currently holds a ref on (with repeats)."""
        return [b for req in self.held for b in req]

    # ------------------------------------------------------------- rules
    @rule(data=st.data())
    def request(self, data: st.DataObject) -> None:
        """A request: match, allocate the rest, insert, then release or keep running."""
        cache, ref = self.cache, self.ref
        assert cache is not None
        tokens, salt = self.draw_prompt(data)
        arr = self.as_input(data, tokens)
        m = ref.match(arr, salt, None, lambda: cache.match(arr, salt=salt))
        have = list(m.block_ids)
        need = -(-len(tokens) // ref.block_size) - len(have)
        ids = ref.allocate(need, lambda: cache.allocate(need))
        if ids is None:
            ref.release(have, lambda: cache.release(have))
            return
        blocks = have + ids
        priority = self.draw_priority(data, salt)
        ref.insert(
            arr,
            blocks,
            salt,
            priority,
            lambda: cache.insert(arr, blocks, salt=salt, priority=priority),
        )
        if blocks and data.draw(st.integers(0, 3), label="keep") == 0:
            self.held.append(blocks)
        else:
            ref.release(blocks, lambda: cache.release(blocks))

    @rule(data=st.data())
    def match(self, data: st.DataObject) -> None:
        """A raw match (sometimes capped by max_tokens); its refs are kept."""
        cache = self.cache
        assert cache is not None
        tokens, salt = self.draw_prompt(data)
        arr = self.as_input(data, tokens)
        cap = data.draw(st.none() | st.integers(0, len(tokens) + 2), label="max_tokens")
        m = self.ref.match(arr, salt, cap, lambda: cache.match(arr, salt=salt, max_tokens=cap))
        if m.block_ids:
            if data.draw(st.booleans(), label="keep"):
                self.held.append(list(m.block_ids))
            else:
                blocks = list(m.block_ids)
                self.ref.release(blocks, lambda: cache.release(blocks))

    @rule(data=st.data())
    def lookup(self, data: st.DataObject) -> None:
        """A lookup of any prompt."""
        cache = self.cache
        assert cache is not None
        tokens, salt = self.draw_prompt(data)
        arr = self.as_input(data, tokens)
        self.ref.lookup(arr, salt, lambda: cache.lookup(arr, salt=salt))

    @rule(n=st.integers(0, 4))
    def allocate(self, n: int) -> None:
        """A raw allocation, kept."""
        cache = self.cache
        assert cache is not None
        ids = self.ref.allocate(n, lambda: cache.allocate(n))
        if ids:
            self.held.append(ids)

    @rule(data=st.data())
    def insert(self, data: st.DataObject) -> None:
        """A raw insert with blocks from anywhere (held, cached, free, invalid)."""
        cache, ref = self.cache, self.ref
        assert cache is not None
        tokens, salt = self.draw_prompt(data)
        arr = self.as_input(data, tokens)
        full = len(tokens) // ref.block_size
        held = self.held_blocks()
        choices = st.integers(0, ref.num_blocks - 1)
        if held:
            choices = st.sampled_from(held) | st.sampled_from(held) | choices
        length = data.draw(st.integers(max(0, full - 1), full + 1), label="length")
        blocks: list[int] = data.draw(st.lists(choices, min_size=length, max_size=length))
        if blocks and full and data.draw(st.integers(0, 9), label="invalid") == 0:
            pos = data.draw(st.integers(0, min(full, len(blocks)) - 1), label="pos")
            blocks[pos] = data.draw(st.sampled_from([-1, ref.num_blocks]), label="bad_id")
        priority = self.draw_priority(data, salt)
        ref.insert(
            arr,
            blocks,
            salt,
            priority,
            lambda: cache.insert(arr, blocks, salt=salt, priority=priority),
        )

    @precondition(lambda self: self.held)
    @rule(data=st.data())
    def release(self, data: st.DataObject) -> None:
        """Release one held request."""
        cache = self.cache
        assert cache is not None
        i = data.draw(st.integers(0, len(self.held) - 1), label="request")
        blocks = self.held.pop(i)
        assert self.ref.release(blocks, lambda: cache.release(blocks))

    # ------------------------------------------------------------- misuse
    @rule(data=st.data())
    def misuse(self, data: st.DataObject) -> None:
        """A bad call of any kind: the exact error, and nothing changes."""
        kind = data.draw(
            st.sampled_from(["release", "fork", "copy_on_write", "tokens", "allocate"]),
            label="misuse",
        )
        getattr(self, f"bad_{kind}")(data)

    def bad_allocate(self, data: st.DataObject) -> None:
        """allocate() with a negative or non-int count, or more than the pool holds."""
        cache = self.cache
        assert cache is not None
        too_many = self.ref.num_blocks + data.draw(st.integers(1, 3), label="extra")
        n = data.draw(st.sampled_from([-1, -5, 1.5, "2", None, too_many]), label="n")
        assert self.ref.allocate(n, lambda: cache.allocate(n)) is None

    def bad_release(self, data: st.DataObject) -> None:
        """Double frees and unknown ids: ValueError and no change at all."""
        cache, ref = self.cache, self.ref
        assert cache is not None
        held = self.held_blocks()
        valid = data.draw(st.lists(st.sampled_from(held), max_size=3)) if held else []
        kind = data.draw(st.sampled_from(["unused", "over", "unknown"]), label="kind")
        if kind == "unused":
            unused = [b for b in range(ref.num_blocks) if ref.refs[b] == 0]
            if not unused:
                return
            bad = [data.draw(st.sampled_from(unused), label="unused")]
        elif kind == "over":
            if not held:
                return
            b = data.draw(st.sampled_from(held), label="over")
            bad = [b] * (ref.refs[b] + 1)
        else:
            bad = [data.draw(st.sampled_from([-1, ref.num_blocks, 10**6]), label="unknown")]
        blocks = valid + bad
        assert not ref.release(blocks, lambda: cache.release(blocks))

    @precondition(lambda self: self.held)
    @rule(data=st.data())
    def fork(self, data: st.DataObject) -> None:
        """Share a held request's blocks (n > 1 samples, agent branches)."""
        cache = self.cache
        assert cache is not None
        blocks = list(data.draw(st.sampled_from(self.held), label="request"))
        assert self.ref.fork(blocks, lambda: cache.fork(blocks))
        self.held.append(blocks)

    def bad_fork(self, data: st.DataObject) -> None:
        """Forking a block nobody holds, or an unknown id: ValueError, no change."""
        cache, ref = self.cache, self.ref
        assert cache is not None
        held = self.held_blocks()
        valid = data.draw(st.lists(st.sampled_from(held), max_size=3)) if held else []
        unused = [b for b in range(ref.num_blocks) if ref.refs[b] == 0]
        bad_choices = [-1, ref.num_blocks, *unused]
        blocks = [*valid, data.draw(st.sampled_from(bad_choices), label="bad")]
        assert not ref.fork(blocks, lambda: cache.fork(blocks))

    @precondition(lambda self: self.held)
    @rule(data=st.data())
    def copy_on_write(self, data: st.DataObject) -> None:
        """Write into a held block: copied when shared or cached."""
        cache = self.cache
        assert cache is not None
        req = data.draw(st.sampled_from(self.held), label="request")
        pos = data.draw(st.integers(0, len(req) - 1), label="pos")
        out = self.ref.copy_on_write(req[pos], lambda: cache.copy_on_write(req[pos]))
        if out is not None:
            req[pos] = out[0]

    def bad_copy_on_write(self, data: st.DataObject) -> None:
        """copy_on_write of a block with ref 0 or an unknown id: ValueError."""
        cache, ref = self.cache, self.ref
        assert cache is not None
        unused = [b for b in range(ref.num_blocks) if ref.refs[b] == 0]
        block = data.draw(st.sampled_from([-1, ref.num_blocks, *unused]), label="bad")
        assert ref.copy_on_write(block, lambda: cache.copy_on_write(block)) is None

    @rule(data=st.data())
    def pin(self, data: st.DataObject) -> None:
        """Pin the cached prefix of a prompt."""
        cache = self.cache
        assert cache is not None
        tokens, salt = self.draw_prompt(data)
        arr = self.as_input(data, tokens)
        self.ref.pin(arr, salt, lambda: cache.pin(arr, salt=salt))

    @rule(data=st.data())
    def unpin(self, data: st.DataObject) -> None:
        """Unpin along a pinned prompt (extended), or along any prompt."""
        cache, ref = self.cache, self.ref
        assert cache is not None
        if ref.pins and data.draw(st.booleans(), label="pinned"):
            salt, prefix = data.draw(st.sampled_from(sorted(ref.pins, key=repr)), label="pin")
            tokens = list(prefix) + data.draw(st.lists(st.integers(0, VOCAB - 1), max_size=5))
        else:
            tokens, salt = self.draw_prompt(data)
        arr = self.as_input(data, tokens)
        ref.unpin(arr, salt, lambda: cache.unpin(arr, salt=salt))

    @rule()
    def reset(self) -> None:
        """Evict everything evictable."""
        cache = self.cache
        assert cache is not None
        self.ref.reset(cache.reset)

    def bad_tokens(self, data: st.DataObject) -> None:
        """Every token-taking method rejects bad token ids and bad salts, changing nothing."""
        cache, ref = self.cache, self.ref
        assert cache is not None
        if data.draw(st.booleans(), label="bad_salt"):
            # Shorter than a block, so insert has no block to object to either.
            short = self.draw_prompt(data)[0][: ref.block_size - 1]
            tokens: object = self.as_input(data, short)
            salt: object = data.draw(st.sampled_from([1, b"x", ["a"], 2.5]), label="salt")
        else:
            tokens = data.draw(st.sampled_from(BAD_TOKENS), label="tokens")
            salt = data.draw(st.sampled_from(SALTS), label="salt")
        method = data.draw(
            st.sampled_from(["match", "lookup", "insert", "pin", "unpin", "block_hashes"]),
            label="method",
        )
        blocks = list(range(min(ref.num_blocks, 8)))
        calls: dict[str, Callable[[], object]] = {
            "match": lambda: ref.match(tokens, salt, None, lambda: cache.match(tokens, salt=salt)),
            "lookup": lambda: ref.lookup(tokens, salt, lambda: cache.lookup(tokens, salt=salt)),
            "insert": lambda: ref.insert(
                tokens, blocks, salt, 0, lambda: cache.insert(tokens, blocks, salt=salt)
            ),
            "pin": lambda: ref.pin(tokens, salt, lambda: cache.pin(tokens, salt=salt)),
            "unpin": lambda: ref.unpin(tokens, salt, lambda: cache.unpin(tokens, salt=salt)),
            "block_hashes": lambda: ref.block_hashes(
                tokens, salt, lambda: cache.block_hashes(tokens, salt=salt)
            ),
        }
        calls[method]()

    # Rule weights: a rule listed under two names is drawn twice as often.
    request_again = request
    release_again = release

    # ------------------------------------------------------------- checks
    def key_hash(self, key: Key) -> int:
        """The block hash of the last block of a cached key."""
        if key not in self.hash_memo:
            assert self.cache is not None
            salt, tokens = key
            self.hash_memo[key] = self.cache.block_hashes(list(tokens), salt=salt)[-1]
        return self.hash_memo[key]

    @invariant()
    def agrees_with_reference(self) -> None:
        """Invariants, stats, cached set, events and ref counts match the reference."""
        cache, ref = self.cache, self.ref
        if cache is None:
            return
        ref.check_self()
        cache.check_invariants()
        stats = cache.stats()
        expected = ref.stats()
        assert {k: stats[k] for k in expected} == expected
        assert Counter(self.held_blocks()) == Counter(
            {b: r for b, r in enumerate(ref.refs) if r}
        ), "test bookkeeping"
        for salt, tokens in ref.leaf_keys():
            ref.lookup(list(tokens), salt, lambda t=tokens, s=salt: cache.lookup(list(t), salt=s))
        for salt, tokens in ref.recently_evicted:
            ref.lookup(list(tokens), salt, lambda t=tokens, s=salt: cache.lookup(list(t), salt=s))
        ref.recently_evicted.clear()
        for event in cache.drain_events():
            if isinstance(event, BlockStored):
                assert event.block_size == ref.block_size
                assert len(event.token_ids) == len(event.block_hashes) * ref.block_size
                self.ledger.update(event.block_hashes)
            else:
                assert isinstance(event, BlockRemoved), event
                self.ledger.subtract(event.block_hashes)
        live = Counter(self.key_hash(key) for key in ref.cached)
        assert +self.ledger == live and -self.ledger == Counter(), "stored - removed != cached"
        # Ref counts: releasing one ref more than the model's count must fail and change
        # nothing. Probe every held block whose count changed, plus one in rotation.
        self.steps += 1
        held = sorted(set(self.held_blocks()))
        probe = {b for b in held if ref.refs[b] != self.last_refs.get(b)}
        if held:
            probe.add(held[self.steps % len(held)])
        for b in sorted(probe):
            over = [b] * (ref.refs[b] + 1)
            assert not ref.release(over, lambda o=over: cache.release(o))
        self.last_refs = {b: ref.refs[b] for b in held}


CacheMachine.TestCase.settings = settings(
    max_examples=60,
    stateful_step_count=80,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
TestCacheStateful = CacheMachine.TestCase
