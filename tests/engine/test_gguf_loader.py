"""GGUF loading on tiny files written like llama.cpp does: names, q/k un-permutation, quants."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch
from gguf_writing import gguf_tensors, llama_cpp_permute, write_tiny_gguf
from model_layer_helpers import greedy_generate, hf_greedy_generate, tiny_hf_model

from prefixcache.engine.model import ContiguousAttention
from prefixcache.engine.model_registry import load_model
from prefixcache.engine.weights import GGUFFile
from prefixcache.engine.weights.gguf_names import hf_name_for_gguf_tensor, unpermute_rotary_rows

Q = gguf.GGMLQuantizationType
PROMPT = [5, 17, 42, 99, 3, 250, 7, 8, 100]


LLAMA3_ROPE = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 32}
VARIANTS = {
    "llama-mqa": ("llama", {"num_key_value_heads": 1}),
    "llama3-rope-freqs": ("llama", {"rope_scaling": LLAMA3_ROPE, "rope_theta": 500000.0}),
    "qwen2-bias": ("qwen2", {}),
}


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_f32_gguf_matches_transformers(tmp_path, variant):
    architecture, overrides = VARIANTS[variant]
    hf_model = tiny_hf_model(architecture, **overrides)
    path = write_tiny_gguf(hf_model, tmp_path / "tiny.gguf", architecture)
    loaded = load_model(path, dtype=torch.float32)
    assert loaded.config.architecture == architecture
    assert loaded.config.attention_bias == (architecture == "qwen2")
    ids = torch.tensor(PROMPT)
    ours = loaded.model.compute_logits(
        loaded.model(ids, torch.arange(len(PROMPT)), ContiguousAttention(2)))
    with torch.inference_mode():
        reference = hf_model(ids[None]).logits[0]
    torch.testing.assert_close(ours, reference, atol=1e-4, rtol=1e-4)
    assert greedy_generate(loaded.model, PROMPT, 12) == hf_greedy_generate(hf_model, PROMPT, 12)
    assert loaded.chat_template is not None and loaded.tokenizer.eos_token_ids == (2,)


def test_mistral_gguf_sliding_window_matches_transformers(tmp_path):
    """`mistral.attention.sliding_window` is applied from the first token past the window."""
    hf_model = tiny_hf_model("mistral", sliding_window=4)
    path = write_tiny_gguf(hf_model, tmp_path / "sw.gguf", "mistral", sliding_window=4)
    loaded = load_model(path, dtype=torch.float32)
    assert loaded.config.sliding_window == 4
    assert greedy_generate(loaded.model, PROMPT, 12) == hf_greedy_generate(hf_model, PROMPT, 12)


@pytest.mark.parametrize("architecture", ["gemma2", "gemma3"])
def test_gemma_gguf_matches_transformers(tmp_path, architecture):
    """llama.cpp's Gemma files: `ffn_norm` is the pre-MLP norm, norms are stored as 1 + w, the
    layer pattern and Gemma 3's local RoPE base are implied by the architecture."""
    hf_model = tiny_hf_model(architecture, sliding_window=4)
    path = write_tiny_gguf(hf_model, tmp_path / "gemma.gguf", architecture, sliding_window=4)
    loaded = load_model(path, dtype=torch.float32)
    config = loaded.config
    assert config.is_gemma and config.layer_windows == (4, None if architecture == "gemma2" else 4)
    assert config.attn_logit_softcap == (50.0 if architecture == "gemma2" else None)
    ids = torch.tensor(PROMPT)
    attention = ContiguousAttention(2, sliding_window=config.layer_windows,
                                    scale=config.softmax_scale, softcap=config.attn_logit_softcap)
    with torch.inference_mode():
        ours = loaded.model.compute_logits(loaded.model(ids, torch.arange(len(PROMPT)), attention))
        hf_model.config._attn_implementation = "eager"
        reference = hf_model(ids[None]).logits[0]
    torch.testing.assert_close(ours, reference, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("qtype", [Q.F16, Q.BF16, Q.Q8_0, Q.Q4_0, Q.Q4_1])
def test_quantized_tensors_dequantize_to_the_quantized_values(tmp_path, qtype):
    hf_model = tiny_hf_model("llama", hidden_size=64, intermediate_size=128)
    path = write_tiny_gguf(hf_model, tmp_path / "q.gguf", "llama", qtype)
    state = GGUFFile(path).hf_state_dict()
    config = hf_model.config
    for name, array in gguf_tensors(hf_model, "llama").items():
        expected = array if array.ndim == 1 else gguf.quants.dequantize(
            gguf.quants.quantize(array, qtype), qtype)
        if name.endswith("attn_q.weight"):
            expected = unpermute_rotary_rows(expected, config.num_attention_heads)
        elif name.endswith("attn_k.weight"):
            expected = unpermute_rotary_rows(expected, config.num_key_value_heads)
        np.testing.assert_array_equal(state[hf_name_for_gguf_tensor(name)].numpy(), expected)


@pytest.mark.parametrize(("qtype", "block_bytes", "scale_offsets"),
                         [(Q.Q4_K, 144, (0, 2)), (Q.Q6_K, 210, (208,))])
def test_k_quant_tensor_reads_like_gguf_dequantize(tmp_path, qtype, block_bytes, scale_offsets):
    rng = np.random.default_rng(0)
    raw = rng.integers(0, 256, size=(4, block_bytes), dtype=np.uint8)  # 4 rows x 256 values
    for offset in scale_offsets:  # keep the fp16 block scales finite and small
        raw[:, offset:offset + 2] = np.frombuffer(np.float16(0.01).tobytes(), np.uint8)
    writer = gguf.GGUFWriter(str(tmp_path / "k.gguf"), "llama")
    writer.add_tensor("blk.0.ffn_up.weight", raw, raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    values = GGUFFile(tmp_path / "k.gguf").read_tensor("blk.0.ffn_up.weight")
    assert values.shape == (4, 256) and values.dtype == np.float32
    np.testing.assert_array_equal(values, gguf.quants.dequantize(raw, qtype).reshape(4, 256))


def test_unpermute_inverts_llama_cpp_permute():
    weight = np.arange(6 * 8 * 3, dtype=np.float32).reshape(6 * 8, 3)  # 6 heads, head_dim 8
    np.testing.assert_array_equal(unpermute_rotary_rows(llama_cpp_permute(weight, 6), 6), weight)


def test_unknown_tensor_and_corrupt_file_raise_value_error(tmp_path):
    with pytest.raises(ValueError, match=r"unsupported GGUF tensor 'blk\.0\.attn_mystery\.weight'"):
        hf_name_for_gguf_tensor("blk.0.attn_mystery.weight")
    (tmp_path / "bad.gguf").write_bytes(b"not a gguf at all")
    with pytest.raises(ValueError, match="cannot read GGUF file"):
        GGUFFile(tmp_path / "bad.gguf")
