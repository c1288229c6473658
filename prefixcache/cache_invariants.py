"""A full, slow consistency check of a PrefixCache: pool, tree, tables and eviction index."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from prefixcache.eviction_index import eviction_key
from prefixcache.hashing import namespace_hash
from prefixcache.radix_tree import PAD

if TYPE_CHECKING:
    from prefixcache.cache import PrefixCache
    from prefixcache.radix_node import RadixNode


def check_cache_invariants(cache: PrefixCache) -> None:
    """Raise AssertionError naming the first broken invariant."""
    tree, pool = cache.tree, cache.pool
    seen = np.zeros(cache.num_blocks, dtype=bool)  # [num_blocks] blocks found in the tree
    expected_index = set()
    pinned = set()
    live_nodes = 0
    for name, root in tree.roots.items():
        assert root.parent is None and not len(root.block_ids), f"root {name} malformed"
        assert root.key == namespace_hash(tree.model_fingerprint, name[0], name[1])
        assert tree.nodes[root.idx] is root, f"root {name} not in the node table"
        assert root.children, f"root {name} is empty but kept"
        live_nodes += 1
        stack: list[tuple[RadixNode, int]] = [(child, root.key) for child in root.children.values()]
        while stack:
            node, parent_hash = stack.pop()
            live_nodes += 1
            _check_node(cache, node, parent_hash, seen)
            if cache._is_evictable(node):
                expected_index.add(eviction_key(node))
            if node.pin_count:
                pinned.add(node)
            last_hash = int(tree.hashes[node.block_ids[-1]])
            stack.extend((child, last_hash) for child in (node.children or {}).values())
    assert live_nodes == sum(node is not None for node in tree.nodes), "node table has orphans"
    assert int(seen.sum()) == tree.num_cached, "cached-block count drifted"
    assert ((tree.node_of >= 0) == seen).all(), "node_of marks a block the tree does not hold"
    assert set(cache.index.keys()) == expected_index, "eviction index differs from evictable leaves"
    assert cache._pinned == pinned, "the pinned-node set differs from the tree's pinned nodes"
    pool.check_invariants(seen)
    stats = cache.stats()
    assert stats["free"] + stats["in_use"] + stats["cached"] == stats["num_blocks"]
    assert stats["cached"] == int(np.count_nonzero(seen & (pool.ref == 0)))
    if cache.host_tier is not None:
        cache.host_tier.check_invariants()


def _check_node(cache: PrefixCache, node: RadixNode, parent_hash: int, seen: np.ndarray) -> None:
    tree = cache.tree
    assert tree.nodes[node.idx] is node, f"{node} not in the node table"
    assert len(node.block_ids), f"{node} is empty"
    assert node.parent is not None and node.parent.children is not None
    assert node.parent.children.get(node.key) is node, f"{node} filed under a wrong key"
    assert node.key == int(tree.hashes[node.block_ids[0]]), f"{node} key is not its first hash"
    assert node.children is None or node.children, f"{node} keeps an empty children dict"
    assert node.pin_count >= 0
    expected_key = eviction_key(node) if cache._is_evictable(node) else None
    assert node.index_key == expected_key, f"{node} index key {node.index_key} != {expected_key}"
    current = parent_hash
    for block in node.block_ids.tolist():
        assert not seen[block], f"block {block} cached twice"
        seen[block] = True
        assert tree.node_of[block] == node.idx, f"block {block} owner is wrong"
        if tree.is_partial(block):
            assert len(node.block_ids) == 1 and node.children is None, f"{node}: partial inside"
            row = tree.tokens[block]
            fill = len(tree.block_tokens(block))
            assert fill > 0 and (row[fill:] == PAD).all() and (row[:fill] >= 0).all()
        data = np.ascontiguousarray(tree.block_tokens(block))
        current = tree.hasher(memoryview(data).cast("B"), current)
        assert int(tree.hashes[block]) == current, f"block {block} hash breaks the chain"
