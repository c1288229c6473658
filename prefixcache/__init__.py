"""prefixcache: a radix tree of hashed token blocks over a ref-counted, copy-on-write block pool.

Pure Python (+ numpy, xxhash, sortedcontainers); never imports torch. See README.md.
"""

from prefixcache.cache import CopyOp, PrefixCache, PrefixMatch
from prefixcache.errors import CacheFull, PrefixCacheError
from prefixcache.events import AllBlocksCleared, BlockRemoved, BlockStored, CacheEvent
from prefixcache.hashing import BlockHasher, xxh3_block_hasher

__all__ = [
    "AllBlocksCleared",
    "BlockHasher",
    "BlockRemoved",
    "BlockStored",
    "CacheEvent",
    "CacheFull",
    "CopyOp",
    "PrefixCache",
    "PrefixCacheError",
    "PrefixMatch",
    "xxh3_block_hasher",
]
__version__ = "0.1.0"
