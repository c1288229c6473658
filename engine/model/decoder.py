"""Llama-family decoder (Llama, Mistral, Qwen2) and Gemma 3 over a flat varlen batch of tokens."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from prefixcache.kernels.cpu.decoder_layer import FUSED_DTYPES, LayerWeights, PagedStep
from prefixcache.kernels.cpu.gemm_candidates import onednn_supports
from prefixcache.kernels.cpu.kernel_choice import (
    ROW_BUCKETS,
    AttentionShape,
    KernelChoice,
    OpShape,
    ProjectionShape,
    choose_kernels,
)
from prefixcache.kernels.cpu.kernel_timing import attention_candidates
from prefixcache.kernels.cpu.windowed_attention import windowed_shape_supported
from prefixcache.kernels.dispatch import cpu_kernels

from ..model_config import ModelConfig, RopeScaling
from .attention_fn import AttentionFn
from .attention_projection import AttentionProjection
from .greedy_head import build_greedy_screen
from .mlp import SwiGLUMLP
from .norms import RMSNorm
from .packed_linear import (
    PackedLinear,
    pack_linear_layers,
    packable_dtype,
    weight_packing_available,
)
from .rope import RotaryEmbedding
from .structure_generation import structure_generation, watch

if TYPE_CHECKING:
    from prefixcache.kernels.cpu.greedy_screen import GreedyScreen

# The RoPE table starts this large and grows on CPU when positions go beyond it.
_INITIAL_ROPE_POSITIONS = 16384


class DecoderLayer(nn.Module):
    """Pre-norm block: `residual += attn(norm(residual)); residual += mlp(norm(residual))`.

    The residual stream is carried beside the block's output, and each residual add happens
    inside the next norm (`RMSNorm.add_and_norm_`): the layer takes the previous block's output
    `delta` and the stream `residual` (None for the first layer, whose input is the embedding)
    and returns its MLP output with the stream before that output is added.

    With `config.sandwich_norms` (Gemma 3) the attention and MLP outputs are normed too before
    they join the stream: `post_attention_norm` norms the attention output, then
    `pre_feedforward_norm` / `post_feedforward_norm` wrap the MLP.
    """

    def __init__(self, config: ModelConfig, layer_idx: int) -> None:
        super().__init__()
        eps = config.rms_norm_eps
        self.input_norm = RMSNorm(config.hidden_size, eps)
        self.attn = AttentionProjection(
            layer_idx, config.hidden_size, config.num_heads, config.num_kv_heads,
            config.head_dim, bias=config.attention_bias, qk_norm=config.qk_norm, eps=eps,
        )
        self.post_attention_norm = RMSNorm(config.hidden_size, eps)
        self.sandwich = config.sandwich_norms
        if self.sandwich:
            self.pre_feedforward_norm = RMSNorm(config.hidden_size, eps)
            self.post_feedforward_norm = RMSNorm(config.hidden_size, eps)
        self.mlp = SwiGLUMLP(config.hidden_size, config.intermediate_size, config.mlp_activation)
        # (packed weights, LayerWeights or None) for the fused path, see `fused_weights`
        self._fused_cache: tuple[tuple[Tensor, ...], LayerWeights | None] | None = None

    def forward(self, delta: Tensor, residual: Tensor | None, cos_sin: Tensor,
                attention: AttentionFn, output_rows: Tensor | None = None,
                ) -> tuple[Tensor, Tensor]:
        """`delta`, `residual` `[num_tokens, hidden]` (both consumed: written in place) ->
        `(mlp_out, residual)`, each `[num_tokens, hidden]`, or `[len(output_rows), hidden]`
        when only those rows are asked for (every token's k/v still reaches the attention).

        Op by op; `CausalLM` runs layers as fused compiled calls where it can (see
        `fused_weights`)."""
        if residual is None:
            residual, normed = delta, self.input_norm(delta)
        else:
            normed = self.input_norm.add_and_norm_(delta, residual)
        attended = self.attn(normed, cos_sin, attention, output_rows)  # [T or R, hidden]
        if output_rows is not None:
            residual = residual.index_select(0, output_rows)  # [R, hidden]
        if self.sandwich:
            attended = self.post_attention_norm(attended)
            normed = self.pre_feedforward_norm.add_and_norm_(attended, residual)
            return self.post_feedforward_norm(self.mlp(normed)), residual
        normed = self.post_attention_norm.add_and_norm_(attended, residual)
        return self.mlp(normed), residual

    def fused_weights(self) -> LayerWeights | None:
        """This layer's weights for the fused compiled layers
        (`prefixcache.kernels.cpu.decoder_layers_cpu`; cached while the packed weights stay
        the same), or None: norms neither bf16 nor float32, a projection not on that dtype's
        compiled GEMM, or shapes the fused layer does not take."""
        attn, mlp = self.attn, self.mlp
        if self.sandwich or attn.q_norm is not None or mlp.activation != "silu":
            return None  # the fused layer is the Llama-family block
        linears = (attn.qkv_proj, attn.o_proj, mlp.gate_up_proj, mlp.down_proj)
        dtype = self.input_norm.weight.dtype
        gemm = "compiled" if dtype is torch.bfloat16 else "compiled_f32"  # the flag to hold
        if not all(isinstance(m, PackedLinear) and getattr(m, gemm) for m in linears):
            return None
        cached = self._fused_cache
        if cached is not None and all(
            held is m.packed for held, m in zip(cached[0], linears, strict=True)
        ):
            return cached[1]
        norms = (self.input_norm.weight, self.post_attention_norm.weight)
        bias = attn.qkv_proj.bias
        usable = (
            dtype in FUSED_DTYPES
            and all(w.dtype is dtype and w.is_contiguous() for w in norms)
            and (bias is None or bias.dtype is dtype)
            and cpu_kernels().fused_layer_supported(
                attn.qkv_proj.in_features, attn.num_heads, attn.num_kv_heads, attn.head_dim,
                mlp.intermediate_size, dtype,
            )
        )
        weights = None
        if usable:
            weights = LayerWeights(
                input_norm=self.input_norm.weight.detach(),
                post_norm=self.post_attention_norm.weight.detach(),
                eps=self.input_norm.eps, qkv=attn.qkv_proj.packed,
                qkv_bias=None if attn.qkv_proj.bias is None else attn.qkv_proj.bias.detach(),
                o=attn.o_proj.packed, gate_up=mlp.gate_up_proj.packed, down=mlp.down_proj.packed,
                heads=attn.num_heads, kv_heads=attn.num_kv_heads, head_dim=attn.head_dim,
                intermediate=mlp.intermediate_size,
            )  # fmt: skip
        self._fused_cache = (tuple(m.packed for m in linears), weights)
        return weights


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
        # Gemma 3's sliding layers rotate with their own base (and no scaling)
        self.local_rotary = None if config.local_rope_theta is None else RotaryEmbedding(
            config.head_dim, config.local_rope_theta, RopeScaling(),
            initial_positions=min(config.max_position_embeddings, _INITIAL_ROPE_POSITIONS),
        )
        self._local_layers = frozenset(
            i for i, window in enumerate(config.layer_windows) if window is not None)
        # (structure_generation, [(attention layer index, LayerWeights)] or None): see
        # `_fused_layers`
        self._fused_plan: tuple[int, list[tuple[int, LayerWeights]] | None] | None = None
        # (the packed head, its int8 screening copy) for `greedy_tokens`, see `pack_weights`
        self._greedy_screen: tuple[PackedLinear, GreedyScreen] | None = None
        self.use_greedy_screen = True  # False: `greedy_tokens` always runs the full head
        # which GEMM each projection runs per row-count bucket (`apply_kernel_choice`); None:
        # the compiled GEMM everywhere, or no choice to make
        self.kernel_choice: KernelChoice | None = None

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
        if self.config.embed_scale is not None:  # Gemma: the scale rounded to the weights' dtype
            hidden = hidden * torch.tensor(self.config.embed_scale, dtype=hidden.dtype)
        cos_sin = self.rotary.cos_sin(positions, hidden.dtype)  # [T, 2, head_dim]
        local_cos_sin = (None if self.local_rotary is None
                         else self.local_rotary.cos_sin(positions, hidden.dtype))  # fmt: skip
        residual: Tensor | None = None
        fused = self._fused_run(attention, hidden)
        choice = self.kernel_choice
        if (
            fused is not None
            and (output_rows is None or output_rows is fused[1].sample_rows)
            and (choice is None or choice.layers_fused(hidden.shape[0]))
        ):
            # every layer, and the final norm where its weight has the layers' dtype, as one
            # compiled call: the same kernels and results as op by op
            final = self.norm.weight
            fold = final.dtype is hidden.dtype and final.is_cpu and final.is_contiguous()
            weights, step, k_caches, v_caches, windows = fused
            hidden, residual = cpu_kernels().decoder_layers_cpu(
                hidden, None, cos_sin, weights, step, k_caches, v_caches,
                sampled_rows_only=output_rows is not None,
                final_norm=(final, self.norm.eps) if fold else None, windows=windows,
            )
            return hidden if fold else self.norm.add_and_norm_(hidden, residual)
        last = len(self.layers) - 1
        for index, layer in enumerate(self.layers):
            rows = cos_sin
            if local_cos_sin is not None and index in self._local_layers:
                rows = local_cos_sin
            hidden, residual = layer(hidden, residual, rows, attention,
                                     output_rows if index == last else None)  # fmt: skip
        return self.norm.add_and_norm_(hidden, residual)

    def _fused_layers(self) -> list[tuple[int, LayerWeights]] | None:
        """Every layer's attention index and `fused_weights`, or None when a layer has none;
        kept until a module or parameter of this model is (re)assigned (`structure_generation`,
        the model watched from the first plan on), so a forward does not walk the layers'
        modules."""
        generation = structure_generation()
        if self._fused_plan is None or self._fused_plan[0] != generation:
            watch(self)
            plan = [(layer.attn.layer_idx, layer.fused_weights()) for layer in self.layers]
            windows = self.config.layer_windows
            usable = bool(plan) and self.local_rotary is None and all(
                weights is not None and (
                    index >= len(windows) or windows[index] is None
                    or windowed_shape_supported(weights.heads, weights.kv_heads,
                                                weights.head_dim)
                ) for index, weights in plan
            )  # fmt: skip
            self._fused_plan = (generation, plan if usable else None)  # type: ignore[assignment]
        return self._fused_plan[1]

    def _fused_run(self, attention: AttentionFn, hidden: Tensor
                   ) -> tuple[list[LayerWeights], PagedStep, list[Tensor], list[Tensor],
                              list[int | None]] | None:
        """`decoder_layers_cpu`'s weights, step, pools and windows for every layer, or None
        unless every one of them can run fused: bf16 or float32 on CPU, compiled GEMM weights,
        a sliding layer's heads taken by the windowed kernel, and an attention that offers
        `paged_step` (the paged runner over bf16 or float32 pools)."""
        paged_step = getattr(attention, "paged_step", None)
        if paged_step is None or hidden.dtype not in FUSED_DTYPES or not hidden.is_cpu:
            return None
        plan = self._fused_layers()
        if plan is None:
            return None
        weights, k_caches, v_caches, windows = [], [], [], []
        step = None
        layer_windows = self.config.layer_windows
        for layer_idx, layer_weights in plan:
            found = paged_step(layer_idx)
            if found is None:
                return None
            step, k_cache, v_cache = found
            weights.append(layer_weights)
            k_caches.append(k_cache)
            v_caches.append(v_cache)
            windows.append(layer_windows[layer_idx] if layer_idx < len(layer_windows) else None)
        assert step is not None
        return weights, step, k_caches, v_caches, windows

    @torch.inference_mode()
    def compute_logits(self, hidden: Tensor) -> Tensor:
        """`hidden` `[n, hidden]` -> logits `[n, vocab]` float32 (matmul in the model dtype;
        Gemma 2's `cap * tanh(logits / cap)` after it)."""
        if self.lm_head is None:  # tied to the embedding
            logits = F.linear(hidden, self.embed_tokens.weight).float()
        else:
            logits = self.lm_head(hidden).float()
        cap = self.config.final_logit_softcap
        return logits if cap is None else torch.tanh(logits / cap).mul_(cap)

    @property
    def greedy_screen(self) -> GreedyScreen | None:
        """The output head's int8 screening copy `greedy_tokens` reads, if it was built."""
        return None if self._greedy_screen is None else self._greedy_screen[1]

    @torch.inference_mode()
    def greedy_tokens(self, hidden: Tensor) -> Tensor:
        """`hidden` `[n, hidden]` -> `[n]` int64 on the CPU: each row's argmax of
        `compute_logits(hidden)` (the lowest id among equal maxima). On CPU with a packed bf16
        head, a few rows go through the head's int8 screening copy (`greedy_head`), reading
        half its bytes; the token is the same. `use_greedy_screen = False` turns that off."""
        screen_ok = self.config.final_logit_softcap is None  # capping can tie large logits
        if self._greedy_screen is not None and self.use_greedy_screen and hidden.is_cpu \
                and screen_ok:  # fmt: skip
            head, screen = self._greedy_screen
            if self.lm_head is head:  # not replaced since it was screened
                tokens = cpu_kernels().screened_argmax(hidden, screen, head.packed)
                if tokens is not None:
                    return tokens
        return self.compute_logits(hidden).argmax(dim=-1).cpu()

    def pack_weights(self) -> int:
        """On CPU, pre-pack every projection and the output head (when tied, a packed copy of
        the embedding) for a GEMM kernel (see `packed_linear`): faster GEMMs, the same results
        up to the last bf16 bit; and, for `greedy_tokens`, the head's int8 screening copy where
        the CPU runs it. Returns how many were packed. The compiled GEMM's packed weights and
        the screen live in memory backed by 2 MB pages where the OS offers them
        (`HugePageArena`): a forward streams them all, with far fewer TLB misses."""
        if self.device.type != "cpu" or not weight_packing_available():
            return 0
        arena = cpu_kernels().HugePageArena()
        tied = self.lm_head is None and packable_dtype(self.dtype)
        if tied:
            self.lm_head = PackedLinear(self.embed_tokens.weight, None, arena)
        packed = int(tied) + pack_linear_layers(self, arena)
        if isinstance(self.lm_head, PackedLinear):
            screen = build_greedy_screen(self.lm_head, arena)
            self._greedy_screen = None if screen is None else (self.lm_head, screen)
        shapes = self.op_shapes()
        if shapes:
            self.apply_kernel_choice(choose_kernels(shapes, self.dtype))
        return packed

    def _projections(self) -> dict[str, list[PackedLinear]]:
        """The packed projections on a compiled GEMM that oneDNN could run instead, by kind
        (`qkv`, `o`, `gate_up`, `down`, `head`)."""
        kinds: dict[str, list[PackedLinear]] = {}
        for layer in self.layers:
            attn, mlp = layer.attn, layer.mlp
            for kind, module in (("qkv", attn.qkv_proj), ("o", attn.o_proj),
                                 ("gate_up", mlp.gate_up_proj), ("down", mlp.down_proj)):
                kinds.setdefault(kind, []).append(module)
        kinds["head"] = [self.lm_head] if self.lm_head is not None else []
        return {
            kind: modules for kind, modules in kinds.items()
            if modules and all(
                isinstance(m, PackedLinear) and (m.compiled or m.compiled_f32)
                and onednn_supports(m.packed.dtype) for m in modules
            )
        }  # fmt: skip

    def op_shapes(self) -> list[OpShape]:
        """The ops a kernel choice covers, with their shapes: the kinds of projection (the
        output head meets the sampled rows only: up to 64 timed) and, where SDPA and a
        compiled kernel both run the model's dtype, the prefill attention."""
        shapes: list[OpShape] = []
        for kind, modules in self._projections().items():
            if len({(m.out_features, m.in_features) for m in modules}) != 1:
                continue  # layers of different shapes: keep the compiled GEMM
            buckets = tuple(b for b in ROW_BUCKETS if b <= 64) if kind == "head" else ROW_BUCKETS
            shapes.append(ProjectionShape(
                kind, modules[0].out_features, modules[0].in_features, buckets
            ))
        attn = self.layers[0].attn if len(self.layers) else None
        if shapes and attn is not None and len(attention_candidates(self.dtype)) > 1:
            shapes.append(AttentionShape(attn.num_heads, attn.num_kv_heads, attn.head_dim))
        return shapes

    def apply_kernel_choice(self, choice: KernelChoice) -> None:
        """Run each op on the implementation `choice` names for each row-count bucket (oneDNN's
        packing is made for the projections that use it, dropped for the others; the paged
        runner asks the choice for the prefill attention); a step whose bucket keeps every
        layer op on its compiled kernel still runs fused."""
        for kind, modules in self._projections().items():
            for module in modules:
                module.use_onednn_for(choice.library_buckets(kind))
        self.kernel_choice = choice
