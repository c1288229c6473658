"""The core on its own: match a prompt, allocate the rest, cache its full blocks, hit them again.

Run: python examples/core_prefix_cache.py
"""

from prefixcache import PrefixCache

cache = PrefixCache(num_blocks=8, block_size=4)
system = [101, 102, 103, 104, 105, 106, 107, 108]  # two full blocks of a shared system prompt
prompt = [*system, 7, 8, 9, 10, 11]

cold = cache.match(prompt)  # nothing cached yet
blocks = cold.block_ids + cache.allocate(4 - len(cold.block_ids))  # 13 tokens -> 4 blocks
print("cold match:", cold)
print("newly cached blocks:", cache.insert(prompt, blocks))  # only the 3 full blocks
cache.release(blocks)  # the request is done; its full blocks stay cached, evictable

warm = cache.match([*system, 1, 2, 3, 4, 5])  # another request with the same system prompt
print("warm match:", warm)
cache.release(warm.block_ids)

# a request that shares only part of the next block: the engine copies that block's first
# tokens into a block of its own instead of computing them again
near = cache.match([*system, 7, 8, 0, 0, 0], partial_block=True)
print("partial match:", near)
cache.release([*near.block_ids, near.partial_block])
print({key: cache.stats()[key] for key in ("free", "in_use", "cached", "hit_tokens")})
cache.check_invariants()
