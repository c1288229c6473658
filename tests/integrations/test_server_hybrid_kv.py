"""A server on a model with sliding-window layers (a tiny Gemma 3: 5 sliding : 1 global) keeps
a hybrid KV cache with fewer sliding slots than one prompt's blocks: through the official
``openai`` client a repeated prompt is a hit with the same answer, and the slot pool shows in
``/v1/cache/stats`` and ``/metrics``."""

from __future__ import annotations

from pathlib import Path

import httpx
import openai
from integration_helpers import SERVED_NAME, cache_stats
from tiny_model_factory import make_tiny_model_dir

from prefixcache.engine.async_llm import AsyncLLM
from prefixcache.engine.llm import LLM
from prefixcache.integrations.server import BackgroundServer, build_app


def test_a_hybrid_cache_serves_hits_through_the_openai_client(tmp_path: Path) -> None:
    folder = make_tiny_model_dir(tmp_path, "gemma3", num_hidden_layers=6, sliding_window=16,
                                 query_pre_attn_scalar=24, tie_word_embeddings=True)  # fmt: skip
    llm = LLM(str(folder), dtype="float32", num_blocks=256, block_size=4,
              max_num_batched_tokens=32, kv_sliding_slots=24)  # fmt: skip
    engine = AsyncLLM(llm)
    prompt = [(5 * i) % 300 + 1 for i in range(150)]  # 38 blocks: more than the 24 slots
    try:
        with BackgroundServer(build_app(engine, model_name=SERVED_NAME)) as server:
            client = openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="none")
            replies = [client.completions.create(model=SERVED_NAME, prompt=prompt, max_tokens=8,
                                                 temperature=0.0) for _ in range(2)]  # fmt: skip
            assert replies[0].choices[0].text == replies[1].choices[0].text
            assert replies[1].usage.prompt_tokens_details.cached_tokens >= 144
            stats = cache_stats(server.base_url)
            assert stats["sliding_slots"] == 24 and stats["sliding_slots_held"] == 0
            assert stats["sliding_slots_taken"] > 0
            metrics = httpx.get(f"{server.base_url}/metrics").text
            assert "prefixcache_sliding_kv_slots 24.0" in metrics
            assert "prefixcache_sliding_kv_slots_taken_total" in metrics
    finally:
        engine.shutdown()
