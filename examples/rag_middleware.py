"""RAG middleware: the same retrieved chunks in any order give the same cached prefix.

    python examples/rag_middleware.py [--model smollm2]
"""

from __future__ import annotations

import argparse

from prefixcache.engine.llm import LLM
from prefixcache.integrations.sdk import LocalClient, RagMiddleware, RagPromptBuilder
from prefixcache.integrations.sdk.rag import RetrievedChunk

CHUNKS = [
    RetrievedChunk("returns#1", "Items can be returned within 30 days with a receipt."),
    RetrievedChunk("returns#2", "Refunds go back to the original payment method."),
    RetrievedChunk("shipping#1", "Standard shipping takes three to five business days."),
]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--num-blocks", type=int, default=None, help="KV pool size in blocks")
    args = parser.parse_args(argv)
    client = LocalClient(LLM(args.model, num_blocks=args.num_blocks))
    rag = RagMiddleware(client, RagPromptBuilder("Answer from the documents only."))
    print("warmed tokens:", rag.warm_documents(CHUNKS))
    questions = [  # the retriever returns the same chunks in a different order each time
        ("Can I return a lamp?", [CHUNKS[0], CHUNKS[2], CHUNKS[1]]),
        ("How is a refund paid?", [CHUNKS[1], CHUNKS[0], CHUNKS[2]]),
        ("How long is shipping?", [CHUNKS[2], CHUNKS[1], CHUNKS[0]]),
    ]
    for question, retrieved in questions:
        answer = rag.ask(question, retrieved, max_tokens=16, temperature=0)
        print(f"{question} -> {answer.text!r} ({answer.usage.cached_tokens}/"
              f"{answer.usage.prompt_tokens} prompt tokens cached)")


if __name__ == "__main__":
    main()
