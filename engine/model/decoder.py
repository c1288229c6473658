"""Llama-family decoder (Llama, Mistral, Qwen2) over a flat varlen batch of tokens."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..model_config import ModelConfig
from .attention_fn import AttentionFn
from .attention_projection import AttentionProjection
from .mlp import SwiGLUMLP
from .norms import RMSNorm
from .packed_linear import (
    PACKABLE_DTYPES,
    PackedLinear,
    pack_linear_layers,
    weight_packing_available,
)
from .rope import RotaryEmbedding

# The RoPE table starts this large and grows on CPU when positions go beyond it.
_INITIAL_ROPE_POSITIONS = 16384


class DecoderLayer(nn.Module):
    """Pre-norm block: `h += attn(norm(h)); h += mlp(norm(h))`."""

    def __init__(self, config: ModelConfig, layer_idx: int) -> None:
        super().__init__()
        self.input_norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.attn = AttentionProjection(
            layer_idx, config.hidden_size, config.num_heads, config.num_kv_heads,
            config.head_dim, bias=config.attention_bias,
        )
        self.post_attention_norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = SwiGLUMLP(config.hidden_size, config.intermediate_size)

    def forward(self, hidden: Tensor, cos: Tensor, sin: Tensor, attention: AttentionFn,
                output_rows: Tensor | None = None) -> Tensor:
        """`hidden` `[num_tokens, hidden]` -> `[num_tokens, hidden]`, or only `output_rows`
        `[len(output_rows), hidden]` (every token's k/v still reaches the attention)."""
        residual = hidden if output_rows is None else hidden.index_select(0, output_rows)
        # The residual adds go into the fresh projection outputs (no extra allocation).
        attended = self.attn(self.input_norm(hidden), cos, sin, attention, output_rows)
        hidden = attended.add_(residual)
        return self.mlp(self.post_attention_norm(hidden)).add_(hidden)


class CausalLM(nn.Module):
    """Token ids + positions in, final-normed hidden states out; `compute_logits` on demand.

    Attention is delegated per call to an `AttentionFn`, so the same weights serve the paged
    runner and the contiguous reference. Weights use the fused layout produced by
    `prefixcache.engine.weights.build_model`; a module constructed directly has uninitialized
    parameters. Both methods run under `torch.inference_mode`.
    """

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        # `_weight` skips the random init (weights always come from a checkpoint).
        self.embed_tokens = nn.Embedding(
            config.vocab_size, config.hidden_size,
            _weight=torch.empty(config.vocab_size, config.hidden_size),
        )
        self.layers = nn.ModuleList(DecoderLayer(config, i) for i in range(config.num_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.lm_head = None if config.tie_word_embeddings else nn.Linear(
            config.hidden_size, config.vocab_size, bias=False
        )
        self.rotary = RotaryEmbedding(
            config.head_dim, config.rope_theta, config.rope_scaling,
            initial_positions=min(config.max_position_embeddings, _INITIAL_ROPE_POSITIONS),
        )

    @property
    def dtype(self) -> torch.dtype:
        return self.embed_tokens.weight.dtype

    @property
    def device(self) -> torch.device:
        return self.embed_tokens.weight.device

    @torch.inference_mode()
    def forward(self, input_ids: Tensor, positions: Tensor, attention: AttentionFn,
                output_rows: Tensor | None = None) -> Tensor:
        """`input_ids` `[num_tokens]` int64, `positions` `[num_tokens]` int64 ->
        hidden `[num_tokens, hidden]` after the final norm.

        `output_rows` `[R]` int64 (ascending) asks for those rows only, `[R, hidden]`: the last
        layer then computes queries, attention, MLP and norm for them alone (a prefill that
        samples one token skips ~1/num_layers of its work); every token's k/v is still cached.
        """
        if input_ids.dim() != 1 or positions.shape != input_ids.shape:
            raise ValueError(
                "input_ids and positions must both be 1-D [num_tokens], got "
                f"{tuple(input_ids.shape)} and {tuple(positions.shape)}"
            )
        hidden = self.embed_tokens(input_ids)  # [T, hidden]
        cos, sin = self.rotary.cos_sin(positions, hidden.dtype)  # [T, 1, head_dim] each
        *body, last = self.layers
        for layer in body:
            hidden = layer(hidden, cos, sin, attention)
        return self.norm(last(hidden, cos, sin, attention, output_rows))

    @torch.inference_mode()
    def compute_logits(self, hidden: Tensor) -> Tensor:
        """`hidden` `[n, hidden]` -> logits `[n, vocab]` float32 (matmul in the model dtype)."""
        if self.lm_head is None:  # tied to the embedding
            return F.linear(hidden, self.embed_tokens.weight).float()
        return self.lm_head(hidden).float()

    def pack_weights(self) -> int:
        """On CPU, pre-pack every projection and the output head (when tied, a packed copy of
        the embedding) for oneDNN: same results, faster GEMMs. Returns how many were packed."""
        if self.device.type != "cpu" or not weight_packing_available():
            return 0
        tied = self.lm_head is None and self.dtype in PACKABLE_DTYPES
        if tied:
            self.lm_head = PackedLinear(self.embed_tokens.weight, None)
        return int(tied) + pack_linear_layers(self)
