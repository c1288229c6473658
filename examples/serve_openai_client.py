"""The OpenAI-compatible server in a background thread, used with the official openai client.

    python examples/serve_openai_client.py [--model smollm2]

(To run the server on its own: `prefixcache serve --model smollm2 --port 8000`.)
"""

from __future__ import annotations

import argparse

import openai

from prefixcache.engine.async_llm import AsyncLLM
from prefixcache.integrations.server import BackgroundServer, build_app

SYSTEM = "You are a concise assistant for a hardware store. Answer in one sentence."


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--num-blocks", type=int, default=None, help="KV pool size in blocks")
    args = parser.parse_args(argv)
    engine = AsyncLLM(model=args.model, num_blocks=args.num_blocks)
    try:
        with BackgroundServer(build_app(engine, model_name="demo")) as server:
            client = openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="unused")
            for question in ("Do you sell hammers?", "Do you sell nails?"):
                reply = client.chat.completions.create(
                    model="demo", max_tokens=20, temperature=0,
                    messages=[{"role": "system", "content": SYSTEM},
                              {"role": "user", "content": question}])
                cached = reply.usage.prompt_tokens_details.cached_tokens
                print(f"{question} -> {reply.choices[0].message.content!r} "
                      f"(prompt {reply.usage.prompt_tokens} tokens, {cached} cached)")
            stream = client.completions.create(model="demo", prompt="The best tool is",
                                               max_tokens=12, stream=True, temperature=0)
            print("streamed:", "".join(chunk.choices[0].text for chunk in stream if chunk.choices))
    finally:
        engine.shutdown()


if __name__ == "__main__":
    main()
