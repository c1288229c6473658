"""The path-compressed radix tree of cached blocks, one root per (salt, extra keys) namespace.

The tree owns the per-block tables of cached blocks (token ids, chained hashes, owning node) and
the node structure. It knows nothing of reference counts or eviction order: the cache decides
*what* to insert or evict, the tree only keeps the structure exact.

Matching descends by hash (one hash per edge: the child's first block) and then confirms the
whole edge by comparing token arrays, so a fully cached 32K-token prompt costs one hash and one
array comparison, and a hash collision can only end a match early.

A *partial* block (fewer tokens than a block: the end of a finished request) is cached as a
leaf node of its own, its token row padded with PAD (never a token id, so it never matches a
full block) and its hash taken over its tokens alone; only `partial_next` finds it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from prefixcache.hashing import (
    BlockHasher,
    chain_block_hashes,
    checked_block_hasher,
    namespace_hash,
)
from prefixcache.radix_node import EMPTY_BLOCKS, RadixNode
from prefixcache.tokens import CanonicalKeys

PAD = -1
"""Token-table filler past the tokens of a partial block."""

NamespaceName = tuple[str | None, CanonicalKeys]
"""(salt, extra keys in canonical form): requests in different namespaces never share a
block. The name is both the key of the namespace's root and what its hash is taken over."""


@dataclass
class PathMatch:
    """Where a prompt's full blocks meet the tree.

    ``steps`` lists the nodes on the cached path with how many of their blocks matched (only the
    last step may match part of its node). ``num_blocks`` is the total matched; ``parent_hash`` is
    the hash of the last matched block (the namespace hash when nothing matched).
    """

    steps: list[tuple[RadixNode, int]]
    num_blocks: int
    parent_hash: int

    def block_ids(self) -> np.ndarray:  # [num_blocks] int32
        if len(self.steps) == 1:
            node, count = self.steps[0]
            return node.block_ids[:count]
        if not self.steps:
            return EMPTY_BLOCKS
        return np.concatenate([node.block_ids[:count] for node, count in self.steps])


@dataclass
class InsertPlan:
    """What an insert will do, computed before anything changes so the caller can validate."""

    name: NamespaceName
    path: PathMatch
    blocked: bool
    """A different block with the same hash already sits where the new blocks would go."""
    hashes: list[int]
    """The chained hashes of the blocks to insert (``path.num_blocks`` onwards)."""


class RadixTree:
    """Per-block tables plus nodes; every cached block belongs to exactly one node."""

    def __init__(
        self, num_blocks: int, block_size: int, hasher: BlockHasher, model_fingerprint: str
    ) -> None:
        self.block_size = block_size
        self.hasher = checked_block_hasher(hasher)
        self.model_fingerprint = model_fingerprint
        self.tokens = np.zeros((num_blocks, block_size), dtype=np.int32)  # [num_blocks, block_size]
        self.hashes = np.zeros(num_blocks, dtype=np.uint64)  # [num_blocks]
        self.node_of = np.full(
            num_blocks, -1, dtype=np.int32
        )  # [num_blocks] node idx, -1 = uncached
        self.nodes: list[RadixNode | None] = []
        self._free_node_slots: list[int] = []
        self.roots: dict[NamespaceName, RadixNode] = {}
        self._root_names: dict[int, NamespaceName] = {}
        self.num_cached = 0

    # ------------------------------------------------------------------ lookup
    def root(self, name: NamespaceName, create: bool = False) -> RadixNode | None:
        root = self.roots.get(name)
        if root is None and create:
            key = namespace_hash(self.model_fingerprint, name[0], name[1])
            root = self._new_node(None, key, EMPTY_BLOCKS, priority=0, last_access=0)
            self.roots[name] = root
            self._root_names[root.idx] = name
        return root

    def namespace_hash(self, name: NamespaceName) -> int:
        root = self.roots.get(name)
        if root is not None:
            return root.key
        return namespace_hash(self.model_fingerprint, name[0], name[1])

    def walk(
        self,
        name: NamespaceName,
        tokens: np.ndarray,  # [num_tokens] int32
        num_blocks: int,
    ) -> PathMatch:
        """Match the first ``num_blocks`` full blocks of ``tokens`` against the cached path."""
        node = self.roots.get(name)
        if node is None:
            return PathMatch([], 0, self.namespace_hash(name))
        bs = self.block_size
        data = memoryview(tokens).cast("B")
        block_bytes = bs * 4
        steps: list[tuple[RadixNode, int]] = []
        pos = 0
        parent_hash = node.key
        while pos < num_blocks and node.children:
            start = pos * block_bytes
            child = node.children.get(self.hasher(data[start : start + block_bytes], parent_hash))
            if child is None:
                break
            ids = child.block_ids
            span = min(len(ids), num_blocks - pos)
            stored = self.tokens[ids[:span]]  # [span, block_size]
            query = tokens[pos * bs : (pos + span) * bs].reshape(span, bs)
            if np.array_equal(stored, query):
                matched = span
            else:
                matched = int((stored != query).any(axis=1).argmax())
            if matched == 0:
                break  # hash collision: the tokens differ, so it is a miss
            steps.append((child, matched))
            pos += matched
            parent_hash = int(self.hashes[ids[matched - 1]])
            if matched < len(ids):
                break
            node = child
        return PathMatch(steps, pos, parent_hash)

    def partial_next(
        self,
        name: NamespaceName,
        path: PathMatch,
        tokens: np.ndarray,  # [num_tokens] int32
        limit: int,
    ) -> tuple[int, int] | None:
        """The cached block right after ``path`` whose leading tokens agree longest with
        ``tokens[path_end:limit]``: ``(block id, tokens shared)``, 1 <= shared < block_size, or
        None. Candidates are the next block of the last matched node when the match ended
        inside it, else the first block of every child of that node (of the root when nothing
        matched). The KV of a block's first ``shared`` tokens depends only on the prefix, so a
        copy of them serves ``tokens`` too."""
        bs = self.block_size
        start = path.num_blocks * bs
        want = min(limit - start, bs - 1)
        if want <= 0:
            return None
        if path.steps and path.steps[-1][1] < len(path.steps[-1][0].block_ids):
            node, matched = path.steps[-1]
            candidates = node.block_ids[matched : matched + 1]
        else:
            parent = path.steps[-1][0] if path.steps else self.roots.get(name)
            if parent is None or not parent.children:
                return None
            candidates = np.fromiter(
                (child.block_ids[0] for child in parent.children.values()), dtype=np.int32
            )
        agree = self.tokens[candidates, :want] == tokens[start : start + want]  # [n, want]
        shared = np.where(agree.all(axis=1), want, agree.argmin(axis=1))  # [n]
        best = int(shared.argmax())
        if shared[best] == 0:
            return None
        return int(candidates[best]), int(shared[best])

    # ------------------------------------------------------------------ insert
    def plan_insert(self, name: NamespaceName, tokens: np.ndarray, num_blocks: int) -> InsertPlan:
        """Find where blocks ``path.num_blocks .. num_blocks - 1`` of ``tokens`` would attach,
        and hash them: every hasher call (the only step that can fail on a custom hasher) is
        made before anything changes."""
        path = self.walk(name, tokens, num_blocks)
        blocked = False
        hashes: list[int] = []
        if path.num_blocks < num_blocks:
            hashes = chain_block_hashes(
                tokens, self.block_size, path.num_blocks, num_blocks, path.parent_hash, self.hasher
            )
            first_key = hashes[0]
            attach = self._attach_point(name, path)
            if attach is not None:
                node, at = attach
                if at is None:
                    blocked = bool(node.children) and first_key in node.children
                else:
                    blocked = first_key == int(self.hashes[node.block_ids[at]])
        return InsertPlan(name, path, blocked, hashes)

    def _attach_point(
        self, name: NamespaceName, path: PathMatch
    ) -> tuple[RadixNode, int | None] | None:
        """(node, None) to attach under node; (node, at) to split node at ``at`` first; None if
        the namespace has no root yet."""
        if not path.steps:
            root = self.roots.get(name)
            return None if root is None else (root, None)
        node, matched = path.steps[-1]
        return (node, None) if matched == len(node.block_ids) else (node, matched)

    def _attach_parent(
        self, name: NamespaceName, path: PathMatch
    ) -> tuple[RadixNode, list[RadixNode]]:
        """The node new blocks attach under after ``path`` (the namespace's root is created, a
        node matched in part is split first), and the nodes whose shape that changed."""
        attach = self._attach_point(name, path)
        if attach is None:
            root = self.root(name, create=True)
            assert root is not None
            return root, []
        parent, at = attach
        if at is None:
            return parent, []
        upper = self.split(parent, at)
        return upper, [upper]

    def commit_insert(
        self,
        plan: InsertPlan,
        tokens: np.ndarray,  # [num_tokens] int32
        new_block_ids: np.ndarray,  # [num_new] int32, for blocks path.num_blocks onwards
        priority: int,
        clock: int,
    ) -> tuple[RadixNode, list[RadixNode], list[int]]:
        """Cache ``new_block_ids`` after the matched path. Returns (node now holding them,
        nodes whose shape changed, the new blocks' hashes). Caller checked ``not plan.blocked``
        and that there is one new block id per planned hash."""
        path = plan.path
        first = path.num_blocks
        end = first + len(new_block_ids)
        hashes = plan.hashes
        assert len(hashes) == len(new_block_ids)
        parent, changed = self._attach_parent(plan.name, path)
        new_block_ids = new_block_ids.astype(np.int32, copy=False)
        self.tokens[new_block_ids] = tokens[
            first * self.block_size : end * self.block_size
        ].reshape(-1, self.block_size)
        self.hashes[new_block_ids] = np.array(hashes, dtype=np.uint64)
        extendable = (
            not parent.is_root
            and parent.children is None
            and parent.pin_count == 0
            and parent.priority == priority
        )
        if extendable:
            parent.block_ids = np.concatenate([parent.block_ids, new_block_ids])
            parent.last_access = clock
            holder = parent
        else:
            holder = self._new_node(parent, hashes[0], new_block_ids.copy(), priority, clock)
            parent.add_child(holder)
            changed.append(parent)  # it may have been an evictable leaf until now
        self.node_of[new_block_ids] = holder.idx
        self.num_cached += len(new_block_ids)
        changed.append(holder)
        return holder, changed, hashes

    def split(self, node: RadixNode, at: int) -> RadixNode:
        """Cut ``node`` after its first ``at`` blocks; returns the new upper node.

        The existing node object keeps the lower part, so its pins, children and eviction
        entry stay valid.
        """
        assert 0 < at < len(node.block_ids) and node.parent is not None
        parent = node.parent
        upper_ids = node.block_ids[:at]
        upper = self._new_node(parent, node.key, upper_ids, node.priority, node.last_access)
        parent.remove_child(node)
        parent.add_child(upper)
        node.block_ids = node.block_ids[at:]
        node.key = int(self.hashes[node.block_ids[0]])
        node.parent = upper
        upper.add_child(node)
        self.node_of[upper_ids] = upper.idx
        return upper

    def block_tokens(self, block: int) -> np.ndarray:  # [n] int32, n <= block_size
        """The tokens a cached block holds (fewer than a block for a partial one)."""
        row = self.tokens[block]
        return row if row[-1] != PAD else row[: int(np.argmax(row == PAD))]

    def is_partial(self, block: int) -> bool:
        return bool(self.tokens[block, -1] == PAD)

    def partial_hash(self, path: PathMatch, tokens: np.ndarray) -> int:  # tokens: [n] int32
        """The hash of the partial block ``tokens[path_end:]`` (its tokens alone) after
        ``path``: what ``insert_partial`` needs, computed before anything changes."""
        start = path.num_blocks * self.block_size
        return self.hasher(memoryview(tokens[start:]).cast("B"), path.parent_hash)

    def insert_partial(
        self,
        name: NamespaceName,
        path: PathMatch,
        tokens: np.ndarray,  # [num_tokens] int32: the path's full blocks, then the partial ones
        block: int,
        key: int,
        priority: int,
        clock: int,
    ) -> list[RadixNode] | None:
        """Cache ``block`` holding ``tokens[path_end:]`` (fewer than a block) as a leaf after
        ``path``, which must cover every full block of ``tokens``; ``key`` is its
        ``partial_hash``. Returns the nodes whose shape changed, or None (nothing changed)
        when the namespace already has that leaf."""
        bs = self.block_size
        start = path.num_blocks * bs
        fill = len(tokens) - start
        assert path.num_blocks == len(tokens) // bs and 0 < fill < bs
        attach = self._attach_point(name, path)
        if attach is not None:
            node, at = attach
            siblings = node.children if at is None else None
            if siblings and key in siblings:
                return None
        parent, changed = self._attach_parent(name, path)
        self.tokens[block] = PAD
        self.tokens[block, :fill] = tokens[start:]
        self.hashes[block] = key
        leaf = self._new_node(parent, key, np.array([block], dtype=np.int32), priority, clock)
        parent.add_child(leaf)
        self.node_of[block] = leaf.idx
        self.num_cached += 1
        return [*changed, parent, leaf]

    # ------------------------------------------------------------------ eviction
    def remove_tail(self, node: RadixNode, count: int) -> np.ndarray:  # [count] int32
        """Uncache the last ``count`` blocks of leaf ``node``; a node left empty is detached
        (and a root left empty is dropped). Returns the removed block ids."""
        assert node.children is None and not node.is_root and 0 < count <= len(node.block_ids)
        keep = len(node.block_ids) - count
        removed = node.block_ids[keep:]
        self.node_of[removed] = -1
        self.num_cached -= count
        if keep:
            node.block_ids = node.block_ids[:keep]
        else:
            parent = node.parent
            assert parent is not None
            parent.remove_child(node)
            node.block_ids = EMPTY_BLOCKS
            self._release_node(node)
            if parent.is_root and parent.children is None:
                del self.roots[self._root_names.pop(parent.idx)]
                self._release_node(parent)
        return removed

    # ------------------------------------------------------------------ node slots
    def _new_node(
        self,
        parent: RadixNode | None,
        key: int,
        block_ids: np.ndarray,
        priority: int,
        last_access: int,
    ) -> RadixNode:
        idx = self._free_node_slots.pop() if self._free_node_slots else len(self.nodes)
        node = RadixNode(idx, parent, key, block_ids, priority, last_access)
        if idx == len(self.nodes):
            self.nodes.append(node)
        else:
            self.nodes[idx] = node
        return node

    def _release_node(self, node: RadixNode) -> None:
        self.nodes[node.idx] = None
        self._free_node_slots.append(node.idx)
        node.parent = None
