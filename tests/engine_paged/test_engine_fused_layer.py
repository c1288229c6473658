"""The fused compiled decoder layers give bitwise the logits of the same compiled ops run one by
one, over every kind of step: prefix hits, chunked prefill, decode batches, n > 1 forks; in
bf16 (the AVX-512 library) and in float32 (the AVX2/FMA library), each where it runs."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch
from kernel_calls import record_calls
from step_logits import record_step_logits
from tiny_model_factory import HEAD_DIM_64, make_tiny_model_dir

from prefixcache.engine.llm import LLM
from prefixcache.engine.model.packed_linear import PackedLinear
from prefixcache.engine.model_runner import PagedAttention
from prefixcache.engine.sampling_params import SamplingParams
from prefixcache.engine.sliding_slots import SlidingSlots
from prefixcache.kernels.cpu.decoder_layer import release_layer_scratch
from prefixcache.kernels.dispatch import cpu_kernels

BF16_KERNELS = cpu_kernels().cpu_attention_available()
DTYPES = [
    pytest.param(
        torch.bfloat16,
        marks=pytest.mark.skipif(not BF16_KERNELS, reason="no bf16 CPU kernels here"),
        id="bf16",
    ),
    pytest.param(
        torch.float32,
        marks=pytest.mark.skipif(
            not cpu_kernels().f32_attention_available(), reason="no float32 CPU kernels here"
        ),
        id="f32",
    ),
]


@pytest.fixture(params=DTYPES)
def dtype(request: pytest.FixtureRequest) -> torch.dtype:
    return request.param

SYSTEM = [(7 * i) % 300 + 1 for i in range(37)]
PROMPTS = [[*SYSTEM, 11, 12, 13], [*SYSTEM, *range(40, 61)], [*SYSTEM, 99], SYSTEM[:20]]


SIBLINGS = [[*SYSTEM, *range(200, 209)], [*SYSTEM, *range(300, 306)]]  # two new suffixes


def step_logits(
    folder: Path, monkeypatch: pytest.MonkeyPatch, fused: bool, dtype: torch.dtype,
    **engine_options: object,
) -> list[torch.Tensor]:
    """Every step's logits: the prompts one at a time (prefix hits), then all together with
    n = 2 (a decode batch next to chunked prefills, forks copying the partial block), then two
    new suffixes of the cached system prompt at once (one step, two prefills over cached
    blocks)."""
    if not fused:
        monkeypatch.setattr(PagedAttention, "paged_step", lambda self, layer_idx: None)
    llm = LLM(str(folder), dtype=dtype, num_blocks=96, block_size=4,
              max_num_batched_tokens=24, **engine_options)  # fmt: skip
    recorded = record_step_logits(llm)
    for prompt in PROMPTS:
        llm.generate([prompt], SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True))
    llm.generate(PROMPTS, SamplingParams(n=2, max_tokens=6, temperature=0.8, seed=3,
                                         ignore_eos=True))  # fmt: skip
    llm.generate(SIBLINGS, SamplingParams(max_tokens=2, temperature=0.0, ignore_eos=True))
    llm.cache.check_invariants()
    assert llm.stats()["in_use"] == 0 and llm.stats()["hit_tokens"] > 0
    monkeypatch.undo()
    return recorded


def test_fused_layers_give_bitwise_the_same_logits(
    tiny_llama_hd64_dir: Path, monkeypatch: pytest.MonkeyPatch, dtype: torch.dtype
) -> None:
    calls = record_calls(monkeypatch, cpu_kernels(), ["decoder_layers_cpu"])
    fused = step_logits(tiny_llama_hd64_dir, monkeypatch, fused=True, dtype=dtype)
    assert calls, "the fused layer did not run"
    calls = record_calls(monkeypatch, cpu_kernels(), ["decoder_layers_cpu"])
    separate = step_logits(tiny_llama_hd64_dir, monkeypatch, fused=False, dtype=dtype)
    assert not calls
    assert len(fused) == len(separate)
    for got, expected in zip(fused, separate, strict=True):
        assert torch.equal(got, expected)


SLIDING_MODELS = {
    "mistral": {"sliding_window": 16},  # every layer slides
    "qwen2": {"sliding_window": 12, "use_sliding_window": True, "max_window_layers": 1,
              "num_hidden_layers": 3},  # a full layer, then two sliding ones
}  # fmt: skip


@pytest.mark.parametrize("hybrid", [True, False], ids=["hybrid", "plain"])
@pytest.mark.parametrize("architecture", sorted(SLIDING_MODELS))
def test_fused_sliding_layers_give_bitwise_the_same_logits(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch,
    dtype: torch.dtype, architecture: str, hybrid: bool,
) -> None:
    """Sliding-window layers run fused (the windowed kernel called from the compiled layer),
    over the logical pool or a hybrid cache's slot pool with fewer slots than the prompts'
    blocks: every step's logits equal the layers run op by op, bit for bit."""
    folder = make_tiny_model_dir(tmp_path_factory.mktemp(f"fused-{architecture}"),
                                 architecture, **HEAD_DIM_64, **SLIDING_MODELS[architecture])
    window = SLIDING_MODELS[architecture]["sliding_window"]
    options = {"hybrid_kv_cache": hybrid}
    if hybrid:  # slots for two running windows: reused as the windows slide
        options["kv_sliding_slots"] = SlidingSlots.min_slots(window, 4, 24) + 2 * (window // 4)
    calls = record_calls(monkeypatch, cpu_kernels(), ["decoder_layers_cpu"])
    fused = step_logits(folder, monkeypatch, fused=True, dtype=dtype, **options)
    assert calls, "the fused layers did not run"
    separate = step_logits(folder, monkeypatch, fused=False, dtype=dtype, **options)
    assert len(fused) == len(separate)
    for got, expected in zip(fused, separate, strict=True):
        assert torch.equal(got, expected)


def test_a_bad_slot_raises_and_the_engine_keeps_serving(
    tiny_llama_hd64_dir: Path, dtype: torch.dtype
) -> None:
    llm = LLM(str(tiny_llama_hd64_dir), dtype=dtype, num_blocks=32, block_size=4)
    weights = llm.engine.runner.model.layers[0].fused_weights()
    assert weights is not None
    kv = llm.engine.runner.kv
    step = cpu_kernels().PagedStep(
        torch.tensor([10_000], dtype=torch.int64), 0,
        torch.zeros(0, 1, dtype=torch.int32), torch.zeros(0, dtype=torch.int32),
        torch.zeros(1, 1, dtype=torch.int32), torch.tensor([0, 1], dtype=torch.int32),
        torch.zeros(1, dtype=torch.int32), 0.125, torch.zeros(1, dtype=torch.int64),
        torch.zeros(1, 1, dtype=torch.int32), torch.ones(1, dtype=torch.int32),
    )  # fmt: skip
    hidden = llm.engine.runner.model.config.hidden_size
    delta = torch.zeros(1, hidden, dtype=dtype)
    cos_sin = torch.zeros(1, 2, weights.head_dim, dtype=dtype)
    with pytest.raises(ValueError, match="slot"):
        cpu_kernels().decoder_layers_cpu(
            delta, None, cos_sin, [weights], step, [kv.k[0]], [kv.v[0]]
        )
    outside = dataclasses.replace(
        step, slot_mapping=torch.tensor([0]), sample_rows=torch.tensor([5])
    )
    with pytest.raises(ValueError, match="sample_rows"):  # a row past the step's tokens
        cpu_kernels().decoder_layers_cpu(
            delta.clone(), None, cos_sin, [weights], outside, [kv.k[0]], [kv.v[0]],
            sampled_rows_only=True,
        )
    out = llm.generate([[1, 2, 3]], SamplingParams(max_tokens=3, temperature=0.0))
    assert len(out[0].token_ids) == 3 and llm.stats()["in_use"] == 0
    release_layer_scratch()  # freed, then grown again by the next step
    again = llm.generate([[1, 2, 3]], SamplingParams(max_tokens=3, temperature=0.0))
    assert again[0].token_ids == out[0].token_ids


def test_the_final_norm_in_the_call_equals_the_separate_norm(
    tiny_llama_hd64_dir: Path, dtype: torch.dtype
) -> None:
    """``final_norm`` gives bitwise what the model's last ``add_and_norm_`` gives after the
    layers, the stream included; a weight of the wrong shape is refused."""
    llm = LLM(str(tiny_llama_hd64_dir), dtype=dtype, num_blocks=32, block_size=4)
    model, kv = llm.engine.runner.model, llm.engine.runner.kv
    weights = [layer.fused_weights() for layer in model.layers]
    step = cpu_kernels().PagedStep(
        torch.tensor([0, 1, 2, 3, 4]), 0, torch.zeros(0, 1, dtype=torch.int32),
        torch.zeros(0, dtype=torch.int32), torch.tensor([[0, 1]], dtype=torch.int32),
        torch.tensor([0, 5], dtype=torch.int32), torch.zeros(1, dtype=torch.int32), 0.125,
        torch.tensor([4]), torch.tensor([[0, 1]], dtype=torch.int32),
        torch.tensor([5], dtype=torch.int32),
    )  # fmt: skip
    torch.manual_seed(0)
    hidden = torch.randn(5, model.config.hidden_size).to(dtype)  # [5, hidden]
    cos_sin = model.rotary.cos_sin(torch.arange(5), dtype)  # [5, 2, head_dim]
    run = cpu_kernels().decoder_layers_cpu
    for rows_only in (False, True):
        out, stream = run(hidden.clone(), None, cos_sin, weights, step, kv.k, kv.v,
                          sampled_rows_only=rows_only)  # fmt: skip
        expected = model.norm.add_and_norm_(out.clone(), stream)  # stream: += out
        normed, added = run(hidden.clone(), None, cos_sin, weights, step, kv.k, kv.v,
                            sampled_rows_only=rows_only,
                            final_norm=(model.norm.weight, model.norm.eps))  # fmt: skip
        assert normed.shape == expected.shape == (1 if rows_only else 5, hidden.shape[1])
        assert torch.equal(normed, expected) and torch.equal(added, stream)
    with pytest.raises(ValueError, match="final_norm"):
        run(hidden.clone(), None, cos_sin, weights, step, kv.k, kv.v,
            final_norm=(model.norm.weight[:-2], model.norm.eps))  # fmt: skip


def test_a_projection_swapped_after_a_forward_reaches_the_fused_layers(
    tiny_llama_hd64_dir: Path, monkeypatch: pytest.MonkeyPatch, dtype: torch.dtype
) -> None:
    """The fused run keeps its per-layer weights between forwards; a module assigned later (a
    new down projection in layer 1) must be what the next forward runs."""
    greedy = SamplingParams(max_tokens=3, temperature=0.0, ignore_eos=True)
    llm = LLM(str(tiny_llama_hd64_dir), dtype=dtype, num_blocks=64, block_size=4,
              enable_prefix_caching=False)  # fmt: skip
    before = llm.generate([PROMPTS[1]], greedy)[0].token_ids
    mlp = llm.engine.runner.model.layers[1].mlp
    old = mlp.down_proj
    generator = torch.Generator().manual_seed(5)
    weight = torch.randn(old.out_features, old.in_features, generator=generator)
    mlp.down_proj = PackedLinear(weight.to(dtype), None)
    calls = record_calls(monkeypatch, cpu_kernels(), ["decoder_layers_cpu"])
    fused = llm.generate([PROMPTS[1]], greedy)[0].token_ids
    assert calls, "the fused layers did not run"
    monkeypatch.setattr(PagedAttention, "paged_step", lambda self, layer_idx: None)
    separate = llm.generate([PROMPTS[1]], greedy)[0].token_ids
    assert fused == separate != before


def test_two_engines_taking_turns_each_run_on_their_own_pools(
    tiny_llama_hd64_dir: Path, monkeypatch: pytest.MonkeyPatch, dtype: torch.dtype
) -> None:
    """The fused run reuses its per-layer arguments while the layers and pools are the same
    objects; two engines taking turns (their prompts hitting what each cached) must each read
    and write their own pools."""
    greedy = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)

    def engines() -> tuple[LLM, LLM]:
        return (
            LLM(str(tiny_llama_hd64_dir), dtype=dtype, num_blocks=64, block_size=4),
            LLM(str(tiny_llama_hd64_dir), dtype=dtype, num_blocks=40, block_size=8),
        )

    expected = []
    for llm in engines():  # each alone, one after the other
        expected.append([llm.generate([p], greedy)[0].token_ids for p in PROMPTS])
    calls = record_calls(monkeypatch, cpu_kernels(), ["decoder_layers_cpu"])
    pair = engines()
    taking_turns: list[list[list[int]]] = [[], []]
    for prompt in PROMPTS:
        for index, llm in enumerate(pair):
            taking_turns[index].append(llm.generate([prompt], greedy)[0].token_ids)
    assert calls and taking_turns == expected
    for llm in pair:
        llm.cache.check_invariants()
        assert llm.stats()["in_use"] == 0 and llm.stats()["hit_tokens"] > 0


@pytest.mark.skipif(not BF16_KERNELS, reason="the phase profile is the bf16 library's")
def test_phase_profile_times_the_fused_layers_only_inside_its_block(
    tiny_llama_hd64_dir: Path,
) -> None:
    llm = LLM(str(tiny_llama_hd64_dir), dtype="bfloat16", num_blocks=64, block_size=4)
    greedy = SamplingParams(max_tokens=3, temperature=0.0, ignore_eos=True)
    llm.generate([PROMPTS[1]], greedy)  # outside any block: not counted
    with cpu_kernels().phase_profile() as idle:
        pass
    assert set(idle) == set(cpu_kernels().PHASES) and not any(idle.values())
    with cpu_kernels().phase_profile() as seconds:
        llm.generate([PROMPTS[0]], greedy)  # a prefill over cached blocks, then decode steps
    for phase in ("norms", "qkv", "rope_kv_write", "attention", "o_proj", "gate_up_silu",
                  "down"):
        assert seconds[phase] > 0, phase
    with cpu_kernels().phase_profile() as one_row:  # all cached: only the last token runs
        llm.generate([PROMPTS[0]], SamplingParams(max_tokens=1, temperature=0.0))
    assert one_row["attention"] > 0 and one_row["qkv"] > 0


def test_fused_layer_supported_follows_each_dtype_s_kernels() -> None:
    supported = cpu_kernels().fused_layer_supported
    f32 = cpu_kernels().f32_attention_available()
    assert supported(576, 9, 3, 64, 1536, torch.float32) is f32  # SmolLM2's shapes
    assert supported(576, 9, 3, 64, 1536, torch.bfloat16) is BF16_KERNELS
    assert not supported(576, 9, 3, 40, 1536, torch.float32)  # RoPE takes multiples of 16
    assert not supported(576, 9, 3, 64, 1540, torch.float32)  # SiLU-and-mul: multiples of 8
    assert not supported(576, 9, 4, 64, 1536, torch.float32)  # 9 heads over 4 kv heads
    assert not supported(576, 9, 3, 512, 1536, torch.float32)  # head_dim past 256
    assert not supported(576, 9, 3, 64, 1536, torch.float16)
