"""Llama-family decoder whose attention is supplied per forward call (see `AttentionFn`)."""

from .attention_fn import AttentionFn
from .contiguous_attention import ContiguousAttention, causal_attention
from .decoder import CausalLM, DecoderLayer

__all__ = ["AttentionFn", "CausalLM", "ContiguousAttention", "DecoderLayer", "causal_attention"]
