"""Triton kernels: paged decode (split-K) and prefill attention, KV store, block copy.

Same signatures as the references in ``prefixcache.kernels.reference``. Importing this
package imports triton; ``prefixcache.kernels`` does so lazily, only when it dispatches here.
"""

from prefixcache.kernels.triton.decode_attention import paged_decode_attention_triton
from prefixcache.kernels.triton.kv_store import copy_blocks_triton, store_kv_triton
from prefixcache.kernels.triton.prefill_attention import paged_prefill_attention_triton

__all__ = [
    "copy_blocks_triton",
    "paged_decode_attention_triton",
    "paged_prefill_attention_triton",
    "store_kv_triton",
]
