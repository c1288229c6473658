"""Self-attention block minus the attention itself: fused QKV projection, RoPE, output proj."""

from __future__ import annotations

from torch import Tensor, nn

from prefixcache.kernels import apply_rotary_

from .attention_fn import AttentionFn
from .norms import RMSNorm


class AttentionProjection(nn.Module):
    """`o_proj(attention(rope(q), rope(k), v))` for one layer.

    `qkv_proj.weight` is `[(num_heads + 2 * num_kv_heads) * head_dim, hidden]`, rows ordered
    q, k, v (HF's q_proj, k_proj, v_proj concatenated at load time); `qkv_proj.bias` exists
    only with `attention_bias` (Qwen2). With `qk_norm` (Gemma 3) each query and key head is
    RMS-normed over `head_dim` (`q_norm`, `k_norm`) before RoPE.
    """

    def __init__(self, layer_idx: int, hidden_size: int, num_heads: int, num_kv_heads: int,
                 head_dim: int, bias: bool, qk_norm: bool = False, eps: float = 1e-6) -> None:
        super().__init__()
        self.layer_idx = layer_idx
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        qkv_out = (num_heads + 2 * num_kv_heads) * head_dim
        self.qkv_proj = nn.Linear(hidden_size, qkv_out, bias=bias)
        self.o_proj = nn.Linear(num_heads * head_dim, hidden_size, bias=False)
        self.q_norm = RMSNorm(head_dim, eps) if qk_norm else None
        self.k_norm = RMSNorm(head_dim, eps) if qk_norm else None

    def forward(self, x: Tensor, cos_sin: Tensor, attention: AttentionFn,
                output_rows: Tensor | None = None) -> Tensor:
        """`x` `[num_tokens, hidden]`, `cos_sin` `[num_tokens, 2, head_dim]` (each token's RoPE
        cos row, then sin row) -> `[num_tokens, hidden]`, or `[len(output_rows), hidden]`: keys
        and values of every token still reach the attention (and its cache), queries only for
        `output_rows`."""
        num_tokens = x.shape[0]
        qkv = self.qkv_proj(x).view(num_tokens, -1, self.head_dim)  # [T, H + 2 * KV, D]
        num_rotated = self.num_heads + self.num_kv_heads
        if self.q_norm is not None and self.k_norm is not None:
            for norm, heads in ((self.q_norm, slice(0, self.num_heads)),
                                (self.k_norm, slice(self.num_heads, num_rotated))):  # fmt: skip
                part = qkv[:, heads]  # [T, heads, D]
                part.copy_(norm(part.reshape(-1, self.head_dim)).view(part.shape))
        # One in-place RoPE op over the query and key heads together.
        apply_rotary_(qkv[:, :num_rotated], cos_sin)
        q = qkv[:, : self.num_heads]  # [T, H, D]
        k = qkv[:, self.num_heads : num_rotated]  # [T, KV, D]
        v = qkv[:, num_rotated:]  # [T, KV, D]
        if output_rows is None:
            out = attention(self.layer_idx, q, k, v)  # [T, H, D]
        else:
            queries = q.index_select(0, output_rows)  # [R, H, D]
            out = attention(self.layer_idx, queries, k, v, query_rows=output_rows)  # [R, H, D]
        return self.o_proj(out.reshape(out.shape[0], self.num_heads * self.head_dim))
