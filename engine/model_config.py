"""Architecture description of a Llama-family decoder, built from HF config.json or GGUF metadata.

`ModelConfig` is the one shape contract shared by the model, the weight loaders and the runner
(which sizes its paged KV pool from `num_layers`, `num_kv_heads` and `head_dim`). Both builders
validate what they read and raise a `ValueError` that names the offending key.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

# HF `model_type` / GGUF `general.architecture` values this engine can run.
SUPPORTED_ARCHITECTURES = ("llama", "mistral", "qwen2")
ROPE_TYPES = ("default", "linear", "llama3")


@dataclass(frozen=True)
class RopeScaling:
    """RoPE frequency scaling. `rope_type` "default" means none.

    "linear": positions are divided by `factor` (inv_freq / factor).
    "llama3": Llama-3.1 style band-wise scaling using the low/high frequency factors and the
    original context length.
    """

    rope_type: str = "default"
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192

    def __post_init__(self) -> None:
        if self.rope_type not in ROPE_TYPES:
            raise ValueError(
                f"unsupported rope scaling type {self.rope_type!r}; supported: {list(ROPE_TYPES)}"
            )
        if self.factor <= 0:
            raise ValueError(f"rope scaling factor must be > 0, got {self.factor}")
        if self.rope_type == "llama3" and self.high_freq_factor <= self.low_freq_factor:
            raise ValueError(
                "llama3 rope scaling needs high_freq_factor > low_freq_factor, got "
                f"{self.high_freq_factor} <= {self.low_freq_factor}"
            )


@dataclass(frozen=True)
class ModelConfig:
    """Shapes and hyper-parameters of a Llama / Mistral / Qwen2 decoder."""

    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    rope_scaling: RopeScaling = field(default_factory=RopeScaling)
    max_position_embeddings: int = 2048
    tie_word_embeddings: bool = False
    attention_bias: bool = False
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()
    # Mistral-style local attention: token i sees keys j with i - window < j <= i (all layers).
    # The model ignores it; AttentionFn implementations must apply it.
    sliding_window: int | None = None

    def __post_init__(self) -> None:
        if self.architecture not in SUPPORTED_ARCHITECTURES:
            raise ValueError(
                f"unsupported architecture {self.architecture!r}; "
                f"supported: {list(SUPPORTED_ARCHITECTURES)}"
            )
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_layers",
                     "num_heads", "num_kv_heads", "head_dim", "max_position_embeddings"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"model config {name} must be a positive integer, got {value!r}")
        if self.num_heads % self.num_kv_heads != 0:
            raise ValueError(
                f"num_heads ({self.num_heads}) must be a multiple of num_kv_heads "
                f"({self.num_kv_heads})"
            )
        if self.head_dim % 2 != 0:
            raise ValueError(f"head_dim must be even for RoPE, got {self.head_dim}")
        if self.sliding_window is not None and self.sliding_window <= 0:
            raise ValueError(f"sliding_window must be > 0 or None, got {self.sliding_window}")
        if self.rms_norm_eps <= 0 or self.rope_theta <= 0:
            raise ValueError(
                f"rms_norm_eps and rope_theta must be > 0, got {self.rms_norm_eps}, "
                f"{self.rope_theta}"
            )

    @property
    def q_size(self) -> int:
        """Width of the query projection output (num_heads * head_dim)."""
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        """Width of the key (or value) projection output (num_kv_heads * head_dim)."""
        return self.num_kv_heads * self.head_dim

    @classmethod
    def from_hf_config(cls, config: Mapping[str, Any]) -> ModelConfig:
        """Build from a parsed Hugging Face `config.json` (transformers 4.x or 5.x layout)."""
        if not isinstance(config, Mapping):
            raise ValueError(f"config.json must hold a JSON object, got {type(config).__name__}")
        architecture = config.get("model_type")
        if architecture is None:
            raise ValueError("config.json has no 'model_type'")
        hidden_size = _require(config, "hidden_size", "config.json")
        num_heads = _require(config, "num_attention_heads", "config.json")
        head_dim = config.get("head_dim") or _exact_div(hidden_size, num_heads, "hidden_size")
        # transformers 5 moves rope_theta and the scaling dict into `rope_parameters`.
        rope_params = config.get("rope_parameters") or {}
        rope_theta = rope_params.get("rope_theta", config.get("rope_theta", 10000.0))
        scaling_dict = config.get("rope_scaling") or rope_params
        return cls(
            architecture=str(architecture),
            vocab_size=_require(config, "vocab_size", "config.json"),
            hidden_size=hidden_size,
            intermediate_size=_require(config, "intermediate_size", "config.json"),
            num_layers=_require(config, "num_hidden_layers", "config.json"),
            num_heads=num_heads,
            num_kv_heads=config.get("num_key_value_heads") or num_heads,
            head_dim=head_dim,
            rms_norm_eps=float(config.get("rms_norm_eps", 1e-6)),
            rope_theta=float(rope_theta),
            rope_scaling=_rope_scaling_from_dict(scaling_dict),
            max_position_embeddings=config.get("max_position_embeddings", 2048),
            tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
            # Qwen2 always has a QKV bias; its config.json does not say so.
            attention_bias=architecture == "qwen2" or bool(config.get("attention_bias", False)),
            bos_token_id=config.get("bos_token_id"),
            eos_token_ids=_as_id_tuple(config.get("eos_token_id")),
            sliding_window=_hf_sliding_window(config),
        )

    @classmethod
    def from_gguf_metadata(
        cls, metadata: Mapping[str, Any], *, has_output_tensor: bool, has_qkv_bias: bool
    ) -> ModelConfig:
        """Build from GGUF key/values (llama.cpp names, e.g. `llama.block_count`).

        `has_output_tensor` / `has_qkv_bias` come from the tensor list: a GGUF states tied
        embeddings and QKV bias only by the presence of `output.weight` / `blk.0.attn_q.bias`.
        """
        architecture = metadata.get("general.architecture")
        if architecture is None:
            raise ValueError("GGUF metadata has no 'general.architecture'")
        arch = str(architecture)
        where = "GGUF metadata"
        hidden_size = _require(metadata, f"{arch}.embedding_length", where)
        num_heads = _require(metadata, f"{arch}.attention.head_count", where)
        vocab_size = metadata.get(f"{arch}.vocab_size")
        if vocab_size is None:
            tokens = metadata.get("tokenizer.ggml.tokens")
            if tokens is None:
                raise ValueError(f"GGUF metadata has neither '{arch}.vocab_size' nor a vocabulary")
            vocab_size = len(tokens)
        head_dim = metadata.get(f"{arch}.attention.key_length") or _exact_div(
            hidden_size, num_heads, f"{arch}.embedding_length"
        )
        scaling_type = metadata.get(f"{arch}.rope.scaling.type", "none")
        if scaling_type in ("none", None):
            scaling = RopeScaling()
        elif scaling_type == "linear":
            scaling = RopeScaling("linear", float(metadata[f"{arch}.rope.scaling.factor"]))
        else:
            raise ValueError(f"unsupported GGUF rope scaling type {scaling_type!r}")
        eos = metadata.get("tokenizer.ggml.eos_token_id")
        return cls(
            architecture=arch,
            vocab_size=int(vocab_size),
            hidden_size=hidden_size,
            intermediate_size=_require(metadata, f"{arch}.feed_forward_length", where),
            num_layers=_require(metadata, f"{arch}.block_count", where),
            num_heads=num_heads,
            num_kv_heads=int(metadata.get(f"{arch}.attention.head_count_kv") or num_heads),
            head_dim=int(head_dim),
            rms_norm_eps=float(metadata.get(f"{arch}.attention.layer_norm_rms_epsilon", 1e-5)),
            rope_theta=float(metadata.get(f"{arch}.rope.freq_base", 10000.0)),
            rope_scaling=scaling,
            max_position_embeddings=int(metadata.get(f"{arch}.context_length", 2048)),
            tie_word_embeddings=not has_output_tensor,
            attention_bias=has_qkv_bias,
            bos_token_id=_optional_int(metadata.get("tokenizer.ggml.bos_token_id")),
            eos_token_ids=_as_id_tuple(eos),
        )


def _hf_sliding_window(config: Mapping[str, Any]) -> int | None:
    """Mistral applies `sliding_window` to every layer; Qwen2 only with `use_sliding_window`,
    and then only from layer `max_window_layers` on, which this engine does not support."""
    window = config.get("sliding_window")
    if window is None:
        return None
    if config.get("model_type") == "qwen2":
        if not config.get("use_sliding_window", False):
            return None
        raise ValueError("Qwen2 per-layer sliding window attention is not supported")
    return int(window)


def _require(source: Mapping[str, Any], key: str, where: str) -> Any:
    if key not in source or source[key] is None:
        raise ValueError(f"{where} is missing required key {key!r}")
    return source[key]


def _exact_div(numerator: int, denominator: int, what: str) -> int:
    if not isinstance(denominator, int) or denominator <= 0 or numerator % denominator:
        raise ValueError(f"{what} ({numerator}) is not divisible by the head count ({denominator})")
    return numerator // denominator


def _optional_int(value: Any) -> int | None:
    return None if value is None else int(value)


def _as_id_tuple(value: Any) -> tuple[int, ...]:
    if value is None:
        return ()
    if isinstance(value, (list, tuple)):
        return tuple(int(v) for v in value)
    return (int(value),)


def _rope_scaling_from_dict(scaling: Mapping[str, Any] | None) -> RopeScaling:
    """Parse HF `rope_scaling` / `rope_parameters` ("type" in 4.x, "rope_type" later)."""
    if not scaling:
        return RopeScaling()
    if not isinstance(scaling, Mapping):
        raise ValueError(f"rope_scaling must be an object, got {scaling!r}")
    rope_type = scaling.get("rope_type", scaling.get("type", "default"))
    if rope_type == "default":
        return RopeScaling()
    if "factor" not in scaling:
        raise ValueError(f"rope scaling {rope_type!r} needs a 'factor'")
    return RopeScaling(
        rope_type=str(rope_type),
        factor=float(scaling["factor"]),
        low_freq_factor=float(scaling.get("low_freq_factor", 1.0)),
        high_freq_factor=float(scaling.get("high_freq_factor", 4.0)),
        original_max_position_embeddings=int(
            scaling.get("original_max_position_embeddings", 8192)
        ),
    )
