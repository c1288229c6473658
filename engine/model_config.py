"""Architecture description of a Llama-family decoder, built from HF config.json or GGUF metadata.

`ModelConfig` is the one shape contract shared by the model, the weight loaders and the runner
(which sizes its paged KV pool from `num_layers`, `num_kv_heads` and `head_dim`). Both builders
validate what they read and raise a `ValueError` that names the offending key.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from . import config_values as cv

# HF `model_type` / GGUF `general.architecture` values this engine can run.
SUPPORTED_ARCHITECTURES = ("llama", "mistral", "qwen2", "gemma2", "gemma3_text")
GEMMA_ARCHITECTURES = ("gemma2", "gemma3_text")
# llama.cpp's names for them: GGUF `general.architecture` -> ours
GGUF_GEMMA_ARCHITECTURES = {"gemma2": "gemma2", "gemma3": "gemma3_text"}
# llama.cpp's layer counts of the 27B Gemmas, whose attention scale is
# (hidden / heads) ** -0.5 rather than head_dim ** -0.5 (their query_pre_attn_scalar)
_GEMMA_27B_LAYERS = {"gemma2": 46, "gemma3": 62}
ROPE_TYPES = ("default", "linear", "llama3")
# HF `hidden_act` values meaning SiLU (a.k.a. swish), the Llama-family MLP activation.
SUPPORTED_ACTIVATIONS = ("silu", "swish")
# Gemma's MLP activation: GELU with the tanh approximation.
GELU_TANH_ACTIVATIONS = ("gelu_pytorch_tanh", "gelu_tanh")


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
    # Local attention: on a sliding layer, token i sees keys j with i - window < j <= i.
    # `sliding_layers[l]` marks layer l sliding (None: every layer, Mistral-style, when
    # `sliding_window` is set). The model ignores both; AttentionFn implementations apply
    # `layer_window(l)`.
    sliding_window: int | None = None
    sliding_layers: tuple[bool, ...] | None = None
    # Gemma 3: GeGLU (tanh GELU) MLP, norms around the attention and the MLP outputs
    # ("sandwich"), per-head RMSNorm of q and k, embeddings scaled by sqrt(hidden), scores
    # scaled by `query_pre_attn_scalar ** -0.5`, and its own RoPE base on sliding layers.
    # Llama-family models keep the defaults.
    mlp_activation: str = "silu"
    sandwich_norms: bool = False
    qk_norm: bool = False
    embed_scale: float | None = None
    attention_scale: float | None = None  # None: head_dim ** -0.5
    local_rope_theta: float | None = None  # None: sliding layers use `rope_theta` too
    # Gemma 2: attention scores become `cap * tanh(scores / cap)`, and so do the logits.
    attn_logit_softcap: float | None = None
    final_logit_softcap: float | None = None

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
        for name in ("attn_logit_softcap", "final_logit_softcap"):
            cap = getattr(self, name)
            if cap is not None and not cap > 0:
                raise ValueError(f"{name} must be > 0 or None, got {cap!r}")
        if self.mlp_activation not in ("silu", "gelu_tanh"):
            raise ValueError(f"mlp_activation must be 'silu' or 'gelu_tanh', got "
                             f"{self.mlp_activation!r}")  # fmt: skip
        if self.sliding_layers is not None:
            if len(self.sliding_layers) != self.num_layers:
                raise ValueError(f"sliding_layers has {len(self.sliding_layers)} entries for "
                                 f"{self.num_layers} layers")  # fmt: skip
            if any(self.sliding_layers) and self.sliding_window is None:
                raise ValueError("sliding layers need a sliding_window")
        if self.rms_norm_eps <= 0 or self.rope_theta <= 0:
            raise ValueError(
                f"rms_norm_eps and rope_theta must be > 0, got {self.rms_norm_eps}, "
                f"{self.rope_theta}"
            )

    @property
    def is_gemma(self) -> bool:
        """Gemma's norms are ``(1 + w)``: the loaders fold the 1 into the stored weights."""
        return self.architecture in GEMMA_ARCHITECTURES

    @property
    def softmax_scale(self) -> float:
        """What attention multiplies q.k by."""
        return self.attention_scale if self.attention_scale is not None else self.head_dim**-0.5

    def layer_window(self, layer_idx: int) -> int | None:
        """The attention window of layer ``layer_idx`` in tokens; None: it sees every key."""
        if self.sliding_window is None:
            return None
        if self.sliding_layers is None or self.sliding_layers[layer_idx]:
            return self.sliding_window
        return None

    @property
    def layer_windows(self) -> tuple[int | None, ...]:
        """``layer_window`` of every layer."""
        return tuple(self.layer_window(i) for i in range(self.num_layers))

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
        """Build from a parsed Hugging Face `config.json` (transformers 4.x or 5.x layout).

        Every value is type-checked (ValueError naming the key): sizes are positive ints (0 is
        invalid, not missing), `hidden_act` must be SiLU, the only MLP activation implemented.
        """
        if not isinstance(config, Mapping):
            raise ValueError(f"config.json must hold a JSON object, got {type(config).__name__}")
        where = "config.json"
        architecture = cv.text(config, "model_type", where)
        if architecture in GEMMA_ARCHITECTURES:
            return _gemma_config(config)
        _check_activation(config.get("hidden_act"), "hidden_act", where)
        hidden_size = cv.positive_int(config, "hidden_size", where)
        num_heads = cv.positive_int(config, "num_attention_heads", where)
        head_dim = cv.positive_int(config, "head_dim", where, None) or _exact_div(
            hidden_size, num_heads, "hidden_size")
        # transformers 5 moves rope_theta and the scaling dict into `rope_parameters`.
        rope_params = cv.mapping(config, "rope_parameters", where)
        rope_theta = cv.number(config, "rope_theta", where, 10000.0)
        rope_theta = cv.number(rope_params, "rope_theta", f"{where} rope_parameters", rope_theta)
        scaling_key = "rope_scaling" if config.get("rope_scaling") else "rope_parameters"
        return cls(
            architecture=architecture,
            vocab_size=cv.positive_int(config, "vocab_size", where),
            hidden_size=hidden_size,
            intermediate_size=cv.positive_int(config, "intermediate_size", where),
            num_layers=cv.positive_int(config, "num_hidden_layers", where),
            num_heads=num_heads,
            num_kv_heads=cv.positive_int(config, "num_key_value_heads", where, num_heads),
            head_dim=head_dim,
            rms_norm_eps=cv.number(config, "rms_norm_eps", where, 1e-6),
            rope_theta=rope_theta,
            rope_scaling=_rope_scaling_from_dict(
                cv.mapping(config, scaling_key, where), f"{where} {scaling_key}"),
            max_position_embeddings=cv.positive_int(config, "max_position_embeddings", where,
                                                    2048),
            tie_word_embeddings=cv.flag(config, "tie_word_embeddings", where, False),
            # Qwen2 always has a QKV bias; its config.json does not say so.
            attention_bias=architecture == "qwen2"
            or cv.flag(config, "attention_bias", where, False),
            bos_token_id=cv.token_id(config, "bos_token_id", where),
            eos_token_ids=cv.token_ids(config, "eos_token_id", where),
            **_hf_sliding_layers(config, cv.positive_int(config, "num_hidden_layers", where)),
        )

    @classmethod
    def from_gguf_metadata(
        cls, metadata: Mapping[str, Any], *, has_output_tensor: bool, has_qkv_bias: bool
    ) -> ModelConfig:
        """Build from GGUF key/values (llama.cpp names, e.g. `llama.block_count`); every value
        is type-checked (ValueError naming the key).

        `has_output_tensor` / `has_qkv_bias` come from the tensor list: a GGUF states tied
        embeddings and QKV bias only by the presence of `output.weight` / `blk.0.attn_q.bias`.
        GGUF has no activation key: llama.cpp runs these architectures with SiLU, as this does.
        """
        where = "GGUF metadata"
        arch = cv.text(metadata, "general.architecture", where)
        if arch in GGUF_GEMMA_ARCHITECTURES:
            return _gguf_gemma_config(metadata, arch, has_output_tensor)
        hidden_size = cv.positive_int(metadata, f"{arch}.embedding_length", where)
        num_heads = cv.positive_int(metadata, f"{arch}.attention.head_count", where)
        vocab_size = _gguf_vocab_size(metadata, arch)
        head_dim = cv.positive_int(metadata, f"{arch}.attention.key_length", where, None)
        return cls(
            architecture=arch,
            vocab_size=vocab_size,
            hidden_size=hidden_size,
            intermediate_size=cv.positive_int(metadata, f"{arch}.feed_forward_length", where),
            num_layers=cv.positive_int(metadata, f"{arch}.block_count", where),
            num_heads=num_heads,
            num_kv_heads=cv.positive_int(metadata, f"{arch}.attention.head_count_kv", where,
                                         num_heads),
            head_dim=head_dim or _exact_div(hidden_size, num_heads, f"{arch}.embedding_length"),
            rms_norm_eps=cv.number(metadata, f"{arch}.attention.layer_norm_rms_epsilon", where,
                                   1e-5),
            rope_theta=cv.number(metadata, f"{arch}.rope.freq_base", where, 10000.0),
            rope_scaling=_gguf_rope_scaling(metadata, arch),
            max_position_embeddings=cv.positive_int(metadata, f"{arch}.context_length", where,
                                                    2048),
            tie_word_embeddings=not has_output_tensor,
            attention_bias=has_qkv_bias,
            bos_token_id=cv.token_id(metadata, "tokenizer.ggml.bos_token_id", where),
            eos_token_ids=cv.token_ids(metadata, "tokenizer.ggml.eos_token_id", where),
            sliding_window=_gguf_sliding_window(metadata, arch),
        )


def _check_activation(value: Any, key: str, where: str) -> None:
    """The MLP runs SiLU (a.k.a. swish) only; absent means SiLU, the Llama-family default."""
    if value is not None and value not in SUPPORTED_ACTIVATIONS:
        raise ValueError(
            f"{where}: {key} is {value!r}; only {list(SUPPORTED_ACTIVATIONS)} "
            "(the same function) is supported"
        )


def _gguf_rope_scaling(metadata: Mapping[str, Any], arch: str) -> RopeScaling:
    """`{arch}.rope.scaling.type` "none" (or absent) or "linear" with its factor."""
    where = "GGUF metadata"
    scaling_type = cv.text(metadata, f"{arch}.rope.scaling.type", where, "none")
    if scaling_type == "none":
        return RopeScaling()
    if scaling_type == "linear":
        return RopeScaling("linear", cv.number(metadata, f"{arch}.rope.scaling.factor", where))
    raise ValueError(f"unsupported GGUF rope scaling type {scaling_type!r}")


def _gemma_config(config: Mapping[str, Any]) -> ModelConfig:
    """Gemma 2 (``gemma2``) or Gemma 3 text (``gemma3_text``) from config.json. Gemma 3's
    rope in both layouts: transformers 5's ``rope_parameters`` keyed by layer type, and 4.x's
    ``rope_theta`` + ``rope_local_base_freq`` + ``rope_scaling`` (the global layers'). Gemma 2
    alternates sliding and full layers, one rope base, soft-capped scores and logits."""
    where = "config.json"
    gemma2 = config.get("model_type") == "gemma2"
    activation = config.get("hidden_activation", config.get("hidden_act", "gelu_pytorch_tanh"))
    if activation not in GELU_TANH_ACTIVATIONS:
        raise ValueError(f"{where}: hidden_activation is {activation!r}; Gemma runs "
                         f"{list(GELU_TANH_ACTIVATIONS)}")  # fmt: skip
    caps = {key: cv.number(config, key, where, None)
            for key in ("attn_logit_softcapping", "final_logit_softcapping")}  # fmt: skip
    hidden_size = cv.positive_int(config, "hidden_size", where)
    num_heads = cv.positive_int(config, "num_attention_heads", where)
    num_layers = cv.positive_int(config, "num_hidden_layers", where)
    head_dim = cv.positive_int(config, "head_dim", where, None) or _exact_div(
        hidden_size, num_heads, "hidden_size")
    rope = cv.mapping(config, "rope_parameters", where)
    if gemma2:
        rope_theta = cv.number(rope, "rope_theta", f"{where} rope_parameters",
                               cv.number(config, "rope_theta", where, 10_000.0))  # fmt: skip
        local_theta = None
        scaling = RopeScaling()
    elif "full_attention" in rope:  # transformers 5: one dict per layer type
        full = cv.mapping(rope, "full_attention", f"{where} rope_parameters")
        local = cv.mapping(rope, "sliding_attention", f"{where} rope_parameters")
        rope_theta = cv.number(full, "rope_theta", f"{where} rope_parameters", 1_000_000.0)
        local_theta = cv.number(local, "rope_theta", f"{where} rope_parameters", 10_000.0)
        scaling = _rope_scaling_from_dict(full, f"{where} rope_parameters full_attention")
    else:
        rope_theta = cv.number(config, "rope_theta", where, 1_000_000.0)
        local_theta = cv.number(config, "rope_local_base_freq", where, 10_000.0)
        scaling = _rope_scaling_from_dict(cv.mapping(config, "rope_scaling", where),
                                          f"{where} rope_scaling")  # fmt: skip
    layers = dict(config)
    if "layer_types" not in layers:  # older configs: every `sliding_window_pattern`-th is full
        pattern = 2 if gemma2 else cv.positive_int(config, "sliding_window_pattern", where, 6)
        layers["layer_types"] = ["full_attention" if (i + 1) % pattern == 0
                                 else "sliding_attention" for i in range(num_layers)]  # fmt: skip
    return ModelConfig(
        architecture="gemma2" if gemma2 else "gemma3_text",
        vocab_size=cv.positive_int(config, "vocab_size", where),
        hidden_size=hidden_size,
        intermediate_size=cv.positive_int(config, "intermediate_size", where),
        num_layers=num_layers,
        num_heads=num_heads,
        num_kv_heads=cv.positive_int(config, "num_key_value_heads", where, num_heads),
        head_dim=head_dim,
        rms_norm_eps=cv.number(config, "rms_norm_eps", where, 1e-6),
        rope_theta=rope_theta,
        rope_scaling=scaling,
        max_position_embeddings=cv.positive_int(config, "max_position_embeddings", where, 131072),
        tie_word_embeddings=cv.flag(config, "tie_word_embeddings", where, True),
        attention_bias=cv.flag(config, "attention_bias", where, False),
        bos_token_id=cv.token_id(config, "bos_token_id", where),
        eos_token_ids=cv.token_ids(config, "eos_token_id", where),
        **_gemma_features(gemma2, hidden_size, caps),
        attention_scale=cv.number(config, "query_pre_attn_scalar", where, head_dim) ** -0.5,
        local_rope_theta=local_theta,
        **_hf_sliding_layers(layers, num_layers),
    )


def _gguf_gemma_config(metadata: Mapping[str, Any], arch: str,
                       has_output_tensor: bool) -> ModelConfig:  # fmt: skip
    """Gemma 2 / 3 from llama.cpp's metadata, with what llama.cpp fixes in code rather than
    in the file: every second layer global (Gemma 2) or every sixth (Gemma 3), Gemma 3's local
    RoPE base 10,000, and the attention scale (head_dim ** -0.5, the 27B models' hidden /
    heads)."""
    where = "GGUF metadata"
    hidden_size = cv.positive_int(metadata, f"{arch}.embedding_length", where)
    num_heads = cv.positive_int(metadata, f"{arch}.attention.head_count", where)
    num_layers = cv.positive_int(metadata, f"{arch}.block_count", where)
    head_dim = cv.positive_int(metadata, f"{arch}.attention.key_length", where, None) or \
        _exact_div(hidden_size, num_heads, f"{arch}.embedding_length")  # fmt: skip
    vocab_size = _gguf_vocab_size(metadata, arch)
    gemma2 = arch == "gemma2"
    pattern = 2 if gemma2 else 6
    window = cv.positive_int(metadata, f"{arch}.attention.sliding_window", where, None)
    scalar = hidden_size / num_heads if num_layers == _GEMMA_27B_LAYERS[arch] else head_dim
    caps = {key: cv.number(metadata, f"{arch}.{key}", where, None)
            for key in ("attn_logit_softcapping", "final_logit_softcapping")}  # fmt: skip
    return ModelConfig(
        architecture=GGUF_GEMMA_ARCHITECTURES[arch],
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=cv.positive_int(metadata, f"{arch}.feed_forward_length", where),
        num_layers=num_layers,
        num_heads=num_heads,
        num_kv_heads=cv.positive_int(metadata, f"{arch}.attention.head_count_kv", where,
                                     num_heads),
        head_dim=head_dim,
        rms_norm_eps=cv.number(metadata, f"{arch}.attention.layer_norm_rms_epsilon", where,
                               1e-6),
        rope_theta=cv.number(metadata, f"{arch}.rope.freq_base", where,
                             10_000.0 if gemma2 else 1_000_000.0),
        rope_scaling=_gguf_rope_scaling(metadata, arch),
        max_position_embeddings=cv.positive_int(metadata, f"{arch}.context_length", where, 8192),
        tie_word_embeddings=not has_output_tensor,
        bos_token_id=cv.token_id(metadata, "tokenizer.ggml.bos_token_id", where),
        eos_token_ids=cv.token_ids(metadata, "tokenizer.ggml.eos_token_id", where),
        **_gemma_features(gemma2, hidden_size, caps),
        attention_scale=scalar**-0.5,
        local_rope_theta=None if gemma2 else 10_000.0,
        sliding_window=window,
        sliding_layers=None if window is None else tuple(
            (i + 1) % pattern != 0 for i in range(num_layers)),
    )


def _gemma_features(gemma2: bool, hidden_size: int,
                    caps: Mapping[str, float | None]) -> dict[str, Any]:  # fmt: skip
    """What every Gemma 2 / 3 config shares, whichever file it comes from."""
    return {"mlp_activation": "gelu_tanh", "sandwich_norms": True, "qk_norm": not gemma2,
            "embed_scale": hidden_size**0.5,
            "attn_logit_softcap": caps["attn_logit_softcapping"],
            "final_logit_softcap": caps["final_logit_softcapping"]}  # fmt: skip


def _gguf_vocab_size(metadata: Mapping[str, Any], arch: str) -> int:
    """``{arch}.vocab_size``, else the length of the file's vocabulary."""
    vocab_size = cv.positive_int(metadata, f"{arch}.vocab_size", "GGUF metadata", None)
    if vocab_size is None:
        tokens = metadata.get("tokenizer.ggml.tokens")
        if not isinstance(tokens, list) or not tokens:
            raise ValueError(f"GGUF metadata has neither '{arch}.vocab_size' nor a vocabulary")
        vocab_size = len(tokens)
    return vocab_size


def _hf_sliding_layers(config: Mapping[str, Any], num_layers: int) -> dict[str, Any]:
    """``sliding_window`` and ``sliding_layers`` from config.json. ``layer_types`` (a list of
    "full_attention" / "sliding_attention", transformers' per-layer field) wins; otherwise
    Mistral slides on every layer, and Qwen2 only with ``use_sliding_window`` and then from
    layer ``max_window_layers`` on."""
    where = "config.json"
    window = cv.positive_int(config, "sliding_window", where, None)
    types = config.get("layer_types")
    if types is not None:
        known = ("full_attention", "sliding_attention")
        if not isinstance(types, list) or len(types) != num_layers or \
                any(t not in known for t in types):  # fmt: skip
            raise ValueError(f"{where}: layer_types must list {num_layers} of {known}")
        sliding = tuple(t == "sliding_attention" for t in types)
        if not any(sliding):
            return {"sliding_window": None, "sliding_layers": None}
        if window is None:
            raise ValueError(f"{where}: layer_types has sliding layers but no sliding_window")
        return {"sliding_window": window, "sliding_layers": sliding}
    if window is None:
        return {"sliding_window": None, "sliding_layers": None}
    if config.get("model_type") == "qwen2":
        if not cv.flag(config, "use_sliding_window", where, False):
            return {"sliding_window": None, "sliding_layers": None}
        first = cv.non_negative_int(config, "max_window_layers", where, num_layers)
        sliding = tuple(i >= first for i in range(num_layers))
        if not any(sliding):
            return {"sliding_window": None, "sliding_layers": None}
        return {"sliding_window": window, "sliding_layers": sliding}
    return {"sliding_window": window, "sliding_layers": None}


def _gguf_sliding_window(metadata: Mapping[str, Any], arch: str) -> int | None:
    """`{arch}.attention.sliding_window` (a positive int, None when absent), applied to every
    layer as Mistral's HF `sliding_window` is.

    Qwen2 is the exception: GGUF has no `use_sliding_window` flag, so a window stated for it is
    ignored, as llama.cpp does and as HF does by default (`use_sliding_window` false).
    """
    window = cv.positive_int(metadata, f"{arch}.attention.sliding_window", "GGUF metadata", None)
    if arch == "qwen2":
        return None
    return window


def _exact_div(numerator: int, denominator: int, what: str) -> int:
    """`numerator // denominator` for positive ints, ValueError if it leaves a remainder."""
    if numerator % denominator:
        raise ValueError(f"{what} ({numerator}) is not divisible by the head count ({denominator})")
    return numerator // denominator


def _rope_scaling_from_dict(scaling: Mapping[str, Any], where: str) -> RopeScaling:
    """Parse HF `rope_scaling` / `rope_parameters` ("type" in 4.x, "rope_type" later)."""
    if not scaling:
        return RopeScaling()
    rope_type = scaling.get("rope_type", scaling.get("type", "default"))
    if rope_type == "default":
        return RopeScaling()
    if "factor" not in scaling:
        raise ValueError(f"rope scaling {rope_type!r} needs a 'factor'")
    return RopeScaling(
        rope_type=str(rope_type),
        factor=cv.number(scaling, "factor", where),
        low_freq_factor=cv.number(scaling, "low_freq_factor", where, 1.0),
        high_freq_factor=cv.number(scaling, "high_freq_factor", where, 4.0),
        original_max_position_embeddings=cv.positive_int(
            scaling, "original_max_position_embeddings", where, 8192),
    )
