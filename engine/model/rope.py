"""Rotary position embedding (rotate-half / GPT-NeoX layout, as in HF Llama) with a cos/sin cache.

The cache holds one `[max_positions, head_dim]` cos and sin table in float32, grown on demand
and cast once per dtype, so a forward pass only gathers rows by position.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from ..model_config import RopeScaling


def rope_inverse_frequencies(head_dim: int, theta: float, scaling: RopeScaling) -> Tensor:
    """Per-pair inverse frequencies `[head_dim // 2]` float32, scaled like transformers does."""
    exponents = torch.arange(0, head_dim, 2, dtype=torch.int64, device="cpu").float() / head_dim
    inv_freq = 1.0 / (theta**exponents)  # [head_dim // 2]
    if scaling.rope_type == "linear":
        return inv_freq / scaling.factor
    if scaling.rope_type == "llama3":
        return _llama3_scale(inv_freq, scaling)
    return inv_freq


def _llama3_scale(inv_freq: Tensor, scaling: RopeScaling) -> Tensor:
    """Llama-3.1 scaling: long wavelengths / factor, short kept, the band between smoothed."""
    old_context = scaling.original_max_position_embeddings
    low_freq_wavelen = old_context / scaling.low_freq_factor
    high_freq_wavelen = old_context / scaling.high_freq_factor
    wavelen = 2 * math.pi / inv_freq  # [head_dim // 2]
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / scaling.factor, inv_freq)
    smooth = (old_context / wavelen - scaling.low_freq_factor) / (
        scaling.high_freq_factor - scaling.low_freq_factor
    )
    smoothed = (1 - smooth) * scaled / scaling.factor + smooth * scaled
    is_medium = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
    return torch.where(is_medium, smoothed, scaled)


class RotaryEmbedding(nn.Module):
    """The cos/sin rows RoPE needs for given positions (``prefixcache.kernels.apply_rotary_``
    applies them to the query and key heads of a fused QKV activation).

    Contract: `positions` are absolute token positions (>= 0). The cos/sin tables are computed
    in float32 exactly as transformers computes them (`position * inv_freq`), then cast to the
    activation dtype, so results match HF in both float32 and bfloat16.
    """

    def __init__(self, head_dim: int, theta: float, scaling: RopeScaling,
                 initial_positions: int = 4096) -> None:
        super().__init__()
        self.head_dim = head_dim
        self.inv_freq = rope_inverse_frequencies(head_dim, theta, scaling)  # [head_dim // 2]
        self._num_cached = 0
        self._cos_sin_f32 = torch.empty(0, 2, head_dim, device="cpu")  # [positions, 2, head_dim]
        self._cast_cache: dict[tuple[torch.dtype, torch.device], Tensor] = {}
        self._grow(initial_positions)

    def set_frequency_factors(self, factors: Tensor) -> None:
        """Divide the inverse frequencies by per-pair factors (GGUF `rope_freqs.weight`)."""
        if factors.shape != self.inv_freq.shape:
            raise ValueError(
                f"rope frequency factors must have shape {tuple(self.inv_freq.shape)}, "
                f"got {tuple(factors.shape)}"
            )
        self.inv_freq = self.inv_freq / factors.to(torch.float32)
        self._grow(max(self._num_cached, 1), force=True)

    def reserve(self, num_positions: int) -> None:
        """Make the cache cover positions `[0, num_positions)` (grows geometrically)."""
        if num_positions > self._num_cached:
            self._grow(num_positions)

    def _grow(self, num_positions: int, force: bool = False) -> None:
        if num_positions <= self._num_cached and not force:
            return
        size = max(num_positions, 2 * self._num_cached) if not force else num_positions
        positions = torch.arange(size, dtype=torch.int64, device="cpu").float()
        freqs = positions[:, None] * self.inv_freq[None, :]  # [size, head_dim // 2]
        emb = torch.cat((freqs, freqs), dim=-1)  # [size, head_dim]
        self._cos_sin_f32 = torch.stack((emb.cos(), emb.sin()), dim=1)  # [size, 2, head_dim]
        self._num_cached = size
        self._cast_cache.clear()

    def cos_sin(self, positions: Tensor, dtype: torch.dtype) -> Tensor:
        """Gather each position's cos row then sin row, `[num_tokens, 2, head_dim]` in `dtype`."""
        if positions.device.type == "cpu" and positions.numel():
            # On CPU the bound check is free; accelerators rely on `reserve` (no host sync).
            self.reserve(int(positions.max()) + 1)
        key = (dtype, positions.device)
        table = self._cast_cache.get(key)
        if table is None:
            table = self._cos_sin_f32.to(device=positions.device, dtype=dtype)
            self._cast_cache[key] = table
        return table.index_select(0, positions)  # [num_tokens, 2, head_dim]
