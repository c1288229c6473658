"""Reference `AttentionFn` for ONE sequence with its own contiguous per-layer KV cache.

Used by tests and as the correctness reference for the paged runner. Each call appends the
new keys/values of that layer to the cache (when `use_cache`) and attends causally: new token
`i` (absolute index `past + i`) sees cached tokens and new tokens `<= i`.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor


class _LayerCache:
    """Growable `[num_kv_heads, capacity, head_dim]` key and value buffers for one layer."""

    def __init__(self, k: Tensor) -> None:  # k: [T, KV, D]
        capacity = max(16, 2 * k.shape[0])
        shape = (k.shape[1], capacity, k.shape[2])
        self.keys = torch.empty(shape, dtype=k.dtype, device=k.device)  # [KV, cap, D]
        self.values = torch.empty_like(self.keys)  # [KV, cap, D]
        self.length = 0

    def append(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Append `[T, KV, D]` keys/values; return views of all cached `[KV, length, D]`."""
        new_length = self.length + k.shape[0]
        if new_length > self.keys.shape[1]:
            capacity = max(new_length, 2 * self.keys.shape[1])
            for name in ("keys", "values"):
                old = getattr(self, name)
                grown = old.new_empty((old.shape[0], capacity, old.shape[2]))
                grown[:, : self.length] = old[:, : self.length]
                setattr(self, name, grown)
        self.keys[:, self.length : new_length] = k.transpose(0, 1)
        self.values[:, self.length : new_length] = v.transpose(0, 1)
        self.length = new_length
        return self.keys[:, :new_length], self.values[:, :new_length]


class ContiguousAttention:
    """Causal SDPA for a single sequence; keeps a KV cache per layer when `use_cache`.

    Contract: all tokens passed to one forward belong to one sequence, in order, and continue
    exactly where the previous forward stopped. `reset()` starts a new sequence. Pass the
    model's `config.layer_windows` (one window or None per layer), or one window for every
    layer (Mistral-style local attention), `config.softmax_scale` where it is not
    `head_dim ** -0.5` (Gemma) and `config.attn_logit_softcap` (Gemma 2).
    """

    def __init__(self, num_layers: int, use_cache: bool = True,
                 sliding_window: int | Sequence[int | None] | None = None,
                 scale: float | None = None, softcap: float | None = None) -> None:  # fmt: skip
        self.num_layers = num_layers
        self.scale = scale
        self.softcap = softcap
        self.use_cache = use_cache
        if sliding_window is None or isinstance(sliding_window, int):
            sliding_window = [sliding_window] * num_layers
        if len(sliding_window) != num_layers:
            raise ValueError(f"{len(sliding_window)} windows for {num_layers} layers")
        self.layer_windows = tuple(sliding_window)
        self._caches: list[_LayerCache | None] = [None] * num_layers

    def reset(self) -> None:
        """Forget all cached keys and values."""
        self._caches = [None] * self.num_layers

    @property
    def num_cached_tokens(self) -> int:
        """Tokens held in the cache of layer 0 (all layers agree after a full forward)."""
        cache = self._caches[0]
        return 0 if cache is None else cache.length

    def __call__(self, layer_idx: int, q: Tensor, k: Tensor, v: Tensor, *,
                 query_rows: Tensor | None = None) -> Tensor:
        """`q` `[T, H, D]` (or `[R, H, D]` for `query_rows`), `k`/`v` `[T, KV, D]` ->
        `[T or R, H, D]`."""
        if self.use_cache:
            cache = self._caches[layer_idx]
            if cache is None:
                cache = self._caches[layer_idx] = _LayerCache(k)
            keys, values = cache.append(k, v)  # [KV, S, D]
        else:
            keys, values = k.transpose(0, 1), v.transpose(0, 1)  # [KV, T, D]
        if query_rows is not None:
            positions = query_rows + (keys.shape[1] - k.shape[0])  # [R] absolute positions
            out = _masked_attention(q.transpose(0, 1), keys, values,
                                    self.layer_windows[layer_idx], positions,
                                    scale=self.scale, softcap=self.softcap)  # fmt: skip
            return out.transpose(0, 1)  # [R, H, D]
        window = self.layer_windows[layer_idx]
        if self.softcap is not None:
            out = _masked_attention(q.transpose(0, 1), keys, values, window, scale=self.scale,
                                    softcap=self.softcap)  # fmt: skip
        else:
            out = causal_attention(q.transpose(0, 1), keys, values, window, self.scale)
        return out.transpose(0, 1)  # [T, H, D]


def causal_attention(q: Tensor, k: Tensor, v: Tensor, sliding_window: int | None = None,
                     scale: float | None = None) -> Tensor:  # fmt: skip
    """Bottom-right-aligned causal attention for one sequence with GQA.

    `q` `[H, T, D]` (the last T of S positions), `k`/`v` `[KV, S, D]` -> `[H, T, D]`.
    With `sliding_window` W, the query at position i sees only keys j with i - W < j <= i.
    `scale` multiplies the scores (None: `D ** -0.5`). Inputs get a batch dim so CPU SDPA
    takes its flash kernel (3-D inputs, or GQA without the batch dim, fall back to the much
    slower math kernel).
    """
    num_heads, num_new, head_dim = q.shape
    num_kv_heads, num_total = k.shape[0], k.shape[1]
    gqa = num_heads != num_kv_heads
    if sliding_window is not None and num_total > sliding_window:
        return _masked_attention(q, k, v, sliding_window, scale=scale)
    if num_new == 1:
        # One new token sees every key: fold each group's query heads into the query axis,
        # `[1, KV, H / KV, D]`, so K/V are read once per KV head and no GQA expansion is needed.
        grouped = q.reshape(1, num_kv_heads, num_heads // num_kv_heads, head_dim)
        out = F.scaled_dot_product_attention(grouped, k[None], v[None], scale=scale)
        return out.reshape(num_heads, 1, head_dim)
    if num_new == num_total:
        out = F.scaled_dot_product_attention(q[None], k[None], v[None], is_causal=True,
                                             enable_gqa=gqa, scale=scale)  # fmt: skip
        return out[0]
    return _masked_attention(q, k, v, None, scale=scale)


def _masked_attention(q: Tensor, k: Tensor, v: Tensor, sliding_window: int | None,
                      query_index: Tensor | None = None, scale: float | None = None,
                      softcap: float | None = None) -> Tensor:  # fmt: skip
    """Explicit-mask path: chunked prefill after a cached prefix, a sliding window, or queries
    at the given absolute positions `query_index` `[T]` (default: the last T positions)."""
    num_new, num_total = q.shape[1], k.shape[1]
    key_index = torch.arange(num_total, device=q.device)
    if query_index is None:
        query_index = torch.arange(num_total - num_new, num_total, device=q.device)
    offset = query_index[:, None] - key_index[None, :]  # [T, S] query pos - key pos
    mask = offset >= 0  # [T, S] bool
    if sliding_window is not None:
        mask &= offset < sliding_window
    if softcap is not None:  # Gemma 2, op by op as transformers' eager attention
        group = q.shape[0] // k.shape[0]
        keys, values = k.repeat_interleave(group, 0), v.repeat_interleave(group, 0)
        scores = torch.matmul(q, keys.transpose(1, 2)) * (scale or q.shape[-1] ** -0.5)
        scores = torch.tanh(scores / softcap) * softcap
        scores = scores.float().masked_fill(~mask, float("-inf"))
        return torch.matmul(torch.softmax(scores, dim=-1).to(q.dtype), values)
    out = F.scaled_dot_product_attention(q[None], k[None], v[None], attn_mask=mask,
                                         enable_gqa=q.shape[0] != k.shape[0], scale=scale)
    return out[0]
