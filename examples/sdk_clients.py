"""One SDK interface, two transports: in process on an ``LLM`` and over HTTP.

    python examples/sdk_clients.py [--model smollm2]
"""

from __future__ import annotations

import argparse

from prefixcache.engine.async_llm import AsyncLLM
from prefixcache.engine.llm import LLM
from prefixcache.integrations.sdk import Client, LocalClient
from prefixcache.integrations.server import BackgroundServer, build_app

MANUAL = "Product manual. Section 1: safety. Keep the device dry and away from children. " * 3


def demo(client: Client | LocalClient, label: str) -> None:
    warmed = client.warm(MANUAL, pin=True)
    answer = client.complete(MANUAL + "\nQ: Where to keep it?\nA:", max_tokens=12,
                             temperature=0)
    print(f"[{label}] warmed {warmed} tokens; answer {answer.text!r}; "
          f"{answer.usage.cached_tokens}/{answer.usage.prompt_tokens} prompt tokens cached")
    pieces = [chunk.text for chunk in client.stream(MANUAL + "\nSummary:", max_tokens=8,
                                                    temperature=0)]
    print(f"[{label}] streamed {len(pieces)} pieces: {''.join(pieces)!r}")
    client.unpin(MANUAL)
    print(f"[{label}] hit rate so far {client.stats()['hit_rate']:.2f}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--num-blocks", type=int, default=None, help="KV pool size in blocks")
    args = parser.parse_args(argv)
    demo(LocalClient(LLM(args.model, num_blocks=args.num_blocks)), "in process")
    engine = AsyncLLM(model=args.model, num_blocks=args.num_blocks)
    try:
        with BackgroundServer(build_app(engine)) as server, Client(server.base_url) as client:
            demo(client, "http")
    finally:
        engine.shutdown()


if __name__ == "__main__":
    main()
