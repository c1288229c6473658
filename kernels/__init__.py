"""Paged-attention kernels with pure-torch references of the same signatures.

Dispatch picks the Triton kernel for CUDA tensors when one exists and the reference elsewhere
(CPU). Never imports the engine or the integrations.
"""

from prefixcache.kernels.reference.kv_store import copy_blocks_reference as copy_blocks
from prefixcache.kernels.reference.kv_store import store_kv_reference as store_kv
from prefixcache.kernels.reference.paged_attention import (
    paged_decode_attention_reference as paged_decode_attention,
)
from prefixcache.kernels.reference.paged_attention import (
    paged_prefill_attention_reference as paged_prefill_attention,
)

__all__ = ["copy_blocks", "paged_decode_attention", "paged_prefill_attention", "store_kv"]
