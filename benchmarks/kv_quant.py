"""Quantized KV (fp8 e4m3 / int8, static per-channel scales) against the bf16 cache on SmolLM2.

Measured side by side in one run, for kv_cache_dtype auto (bf16), fp8 and int8:
1. KV bytes per token (target: fp8/int8 at most half of bf16);
2. greedy-token agreement over 20 prompts: the bf16 engine's greedy continuation is fed back
   token by token (teacher forcing) and every step's argmax is compared (target >= 95%);
   free-running engine outputs are compared too (identical completions, per-position);
3. perplexity of a fixed text decoded token by token, every key and value read back from
   the (quantized) pool (target: change <= 1%);
4. prefix-cache hit rate on a memory-pressured RAG workload: the same KV memory budget, the
   same request sequence, each request = one of several documents + a question.

    python benchmarks/kv_quant.py [--quick] [--out results/kv_quant.json]
"""

from __future__ import annotations

import argparse
import math
import random
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from bench_report import write_json

from prefixcache.engine.kv_cache import PagedKVCache, calibrate_kv_scales
from prefixcache.engine.llm import LLM
from prefixcache.engine.sampling_params import SamplingParams
from prefixcache.kernels import paged_decode_attention, paged_prefill_attention, store_kv

DTYPES = ("auto", "fp8", "int8")
TARGETS = {"bytes_ratio_max": 0.5, "agreement_min": 0.95, "ppl_change_max": 0.01}
BLOCK_SIZE = 16
QUESTIONS = [
    "What is the capital of France?", "Explain photosynthesis in one sentence.",
    "Write a haiku about the sea.", "How many legs does a spider have?",
    "What does a compiler do?", "Name three primary colors.",
    "Why is the sky blue?", "Give me a tip for learning a new language.",
    "What is 12 times 11?", "Describe a cat to someone who has never seen one.",
    "What is the boiling point of water at sea level?", "Suggest a name for a bakery.",
    "What causes the seasons on Earth?", "How do vaccines work?",
    "Translate 'good morning' into Spanish.", "What is a prime number?",
    "Summarize the plot of Cinderella.", "Why do we need sleep?",
    "What is the difference between weather and climate?", "How does a bicycle stay upright?",
]
FIXED_TEXT = (
    "The history of the printing press is a story about how ideas travel. Before movable type, "
    "books were copied by hand, usually in monasteries, and a single volume could take months "
    "to finish. Around 1440, Johannes Gutenberg combined several existing technologies into a "
    "practical system: metal type cast in a hand mould, an oil-based ink that stuck to metal, "
    "and a screw press adapted from those used to make wine and olive oil. The result was not "
    "merely faster copying. Because every copy of a printed page was the same, scholars in "
    "different cities could refer to the same passage on the same page, correct the same "
    "errors, and build on one another's work. Printers became publishers, and publishers "
    "looked for readers, so books grew cheaper and smaller, and they were written more and "
    "more often in the languages people spoke at home rather than in Latin. Within fifty "
    "years, presses were running in more than two hundred European towns, and millions of "
    "volumes had been printed. Historians still argue about how much the press caused and how "
    "much it merely accelerated. The Reformation, the scientific revolution and the rise of "
    "newspapers all depended on printed material, yet each also had causes that had nothing to "
    "do with ink and paper. What is clear is that the cost of sharing a written idea fell "
    "sharply, and when the cost of sharing falls, the number of people who take part in a "
    "conversation rises. Something similar happened again with the telegraph, the telephone "
    "and the internet, each of which made it cheaper to move words from one place to another. "
    "Consider how a modern kitchen works during a busy evening. Orders arrive faster than any "
    "single cook could handle them, so the work is divided into stations: one person grills, "
    "another prepares sauces, a third plates the dishes and checks each one before it leaves. "
    "Much of the preparation happens hours earlier. Onions are chopped, stocks are reduced and "
    "doughs are rested in the afternoon, because an ingredient that is ready when the order "
    "comes in saves minutes that the guests would otherwise spend waiting. A good chef plans "
    "this in advance by looking at which dishes are ordered most often and which components "
    "they share. If three popular plates use the same roasted garlic, it is made once, in a "
    "large batch, and kept within reach. Space on the counter is limited, though, and whatever "
    "sits there must be used before it spoils, so the least useful items are cleared away to "
    "make room for the ones the evening is likely to need. Experienced cooks do this almost "
    "without thinking, and the difference between a calm service and a chaotic one often comes "
    "down to how well the kitchen guessed, hours before, what its guests would ask for."
)


def rag_documents(count: int, sentences: int) -> list[str]:
    topics = ["a harbour town", "a mountain railway", "a river delta", "an old library",
              "a desert observatory", "a coastal forest", "a glass factory", "a salt mine",
              "a tea plantation", "a windmill village"]
    docs = []
    for d in range(count):
        lines = [f"Document {d}: notes about {topics[d % len(topics)]}."]
        for s in range(sentences):
            lines.append(f"Record {s} of site {d} lists {(d * 37 + s * 11) % 97} visitors, "
                         f"{(d + s * 7) % 13} guides and a rainfall of {(d * 5 + s) % 41} mm.")
        docs.append(" ".join(lines))
    return docs


def paged_attention_fn(kv: PagedKVCache, table: torch.Tensor, slots: torch.Tensor,
                       starts: torch.Tensor, context: torch.Tensor, decode: bool) -> Any:
    """The model's attention hook for one step: store k/v in ``slots``, attend over the pool.
    ``decode``: one new token per sequence, every key/value read back from the pool."""
    lens = (context + 1).to(torch.int32)

    def attend(layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        caches, scales = (kv.k[layer], kv.v[layer]), (kv.k_scale[layer], kv.v_scale[layer])
        scale = q.shape[-1] ** -0.5
        store_kv(k, v, *caches, slots, *scales)
        if decode:
            return paged_decode_attention(q, *caches, table, lens, scale, *scales)
        return paged_prefill_attention(q, k, v, *caches, table, starts, context, scale, *scales)

    return attend


def lockstep_logits(llm: LLM, kv_cache_dtype: str, sequences: list[list[int]],
                    prefill_lens: list[int]) -> list[torch.Tensor]:
    """Prefill ``seq[:prefill_len]`` of every sequence in one varlen step, then decode the rest
    one token per sequence per step (all sequences have the same remainder). Returns, per
    sequence, logits [len(seq) - prefill_len + 1, vocab] float32: after the prefill, then
    after every decoded token. Each sequence owns its own blocks of a fresh pool."""
    model = llm.engine.runner.model
    remainder = {len(s) - p for s, p in zip(sequences, prefill_lens, strict=True)}
    assert len(remainder) == 1, "sequences must have equal remainders"
    per_seq = -(-max(map(len, sequences)) // BLOCK_SIZE)
    kv = PagedKVCache(llm.config, per_seq * len(sequences), BLOCK_SIZE, llm.dtype,
                      kv_cache_dtype=kv_cache_dtype)
    calibrate_kv_scales(model, kv)
    table = torch.arange(kv.num_blocks, dtype=torch.int32).view(len(sequences), per_seq)
    base = [i * per_seq * BLOCK_SIZE for i in range(len(sequences))]  # first slot per sequence
    ids = torch.tensor([t for s, n in zip(sequences, prefill_lens, strict=True) for t in s[:n]])
    positions = torch.cat([torch.arange(n) for n in prefill_lens])
    slots = torch.cat([b + torch.arange(n) for b, n in zip(base, prefill_lens, strict=True)])
    starts = torch.tensor([0, *prefill_lens], dtype=torch.int32).cumsum(0).to(torch.int32)
    zeros = torch.zeros(len(sequences), dtype=torch.int32)
    hook = paged_attention_fn(kv, table, slots, starts, zeros, decode=False)
    hidden = model(ids, positions, hook)  # [total prefill tokens, hidden]
    steps = [model.compute_logits(hidden[starts[1:].long() - 1])]  # [num_seqs, vocab]
    for offset in range(remainder.pop()):
        positions = torch.tensor([n + offset for n in prefill_lens])  # [num_seqs]
        ids = torch.tensor([s[p] for s, p in zip(sequences, positions.tolist(), strict=True)])
        slots = torch.tensor(base) + positions
        hook = paged_attention_fn(kv, table, slots, starts, positions.to(torch.int32), True)
        steps.append(model.compute_logits(model(ids, positions, hook)))
    stacked = torch.stack(steps, dim=1)  # [num_seqs, remainder + 1, vocab]
    return list(stacked.unbind(0))


def teacher_forced_agreement(llm: LLM, kv_cache_dtype: str, prompts: list[list[int]],
                             continuations: list[list[int]]) -> float:
    """Prompts prefilled, then the reference continuations decoded token by token; fraction of
    steps whose argmax equals the reference token."""
    sequences = [p + c[:-1] for p, c in zip(prompts, continuations, strict=True)]
    logits = lockstep_logits(llm, kv_cache_dtype, sequences, [len(p) for p in prompts])
    same = sum(int((lg.argmax(-1) == torch.tensor(c)).sum())
               for lg, c in zip(logits, continuations, strict=True))
    return same / sum(map(len, continuations))


def perplexity(llm: LLM, kv_cache_dtype: str, ids: list[int], segments: int) -> float:
    """Perplexity of ``ids`` cut into ``segments`` pieces decoded side by side, token by token
    (so every key/value but the current one's is read back from the pool)."""
    length = len(ids) // segments
    pieces = [ids[i * length : (i + 1) * length] for i in range(segments)]
    logits = lockstep_logits(llm, kv_cache_dtype, pieces, [1] * segments)
    nll = [F.cross_entropy(lg[:-1], torch.tensor(p[1:]), reduction="sum")
           for lg, p in zip(logits, pieces, strict=True)]
    return math.exp(float(sum(nll)) / (segments * (length - 1)))


def rag_hit_rate(llm: LLM, docs: list[str], requests: int, seed: int) -> dict[str, float]:
    rng = random.Random(seed)
    params = SamplingParams(max_tokens=2, temperature=0.0, ignore_eos=True)
    before = llm.stats()
    for i in range(requests):
        doc = docs[min(int(rng.expovariate(0.35)), len(docs) - 1)]  # skewed popularity
        llm.generate(f"{doc}\nQuestion {i}: how many visitors came?\nAnswer:", params)
    after = llm.stats()
    query = after["query_tokens"] - before["query_tokens"]
    hits = after["hit_tokens"] - before["hit_tokens"]
    llm.cache.check_invariants()
    assert after["in_use"] == 0
    return {"hit_rate": hits / query, "evictions": after["evictions"] - before["evictions"],
            "num_blocks": after["num_blocks"]}


def run(args: argparse.Namespace) -> dict[str, Any]:
    torch.manual_seed(0)
    docs = rag_documents(args.docs, args.doc_sentences)
    questions = QUESTIONS[: args.prompts]
    result: dict[str, Any] = {"config": vars(args) | {"targets": TARGETS}}
    auto = LLM(args.model, block_size=BLOCK_SIZE, num_blocks=args.cache_tokens // BLOCK_SIZE,
               num_threads=args.threads)
    engines = {"auto": auto}
    for name in DTYPES[1:]:  # the same KV memory as the bf16 pool
        engines[name] = LLM(args.model, block_size=BLOCK_SIZE, kv_cache_dtype=name,
                            kv_cache_memory=auto.kv.nbytes, num_threads=args.threads)
    prompts = [auto.encode(auto.render_chat([{"role": "user", "content": q}])) for q in questions]
    text_ids = auto.encode(FIXED_TEXT)[: args.text_tokens]
    result["config"]["text_tokens_used"] = len(text_ids)
    greedy = SamplingParams(max_tokens=args.new_tokens, temperature=0.0, ignore_eos=True)
    for name, llm in engines.items():
        started = time.perf_counter()
        rag = rag_hit_rate(llm, docs, args.requests, seed=1)
        outs = [o.token_ids for o in llm.generate(prompts, greedy)]
        result[name] = {"kv_cache_dtype": name, "bytes_per_token": llm.kv.bytes_per_token,
                        "rag": rag, "outputs": outs}
        result[name]["perplexity"] = perplexity(auto, name, text_ids, args.text_segments)
        result[name]["seconds"] = round(time.perf_counter() - started, 1)
    reference = result["auto"]["outputs"]
    auto_rag = result["auto"]["rag"]
    for name in DTYPES:
        entry = result[name]
        outs = entry.pop("outputs")
        same = sum(a == b for o, r in zip(outs, reference, strict=True)
                   for a, b in zip(o, r, strict=True))
        entry["free_running_position_agreement"] = same / sum(map(len, reference))
        entry["identical_completions"] = sum(o == r for o, r in zip(outs, reference, strict=True))
        entry["teacher_forced_agreement"] = teacher_forced_agreement(auto, name, prompts, reference)
        entry["bytes_ratio"] = entry["bytes_per_token"] / result["auto"]["bytes_per_token"]
        entry["ppl_change"] = entry["perplexity"] / result["auto"]["perplexity"] - 1
        entry["hit_rate_ratio"] = entry["rag"]["hit_rate"] / max(auto_rag["hit_rate"], 1e-9)
        entry["meets_targets"] = name == "auto" or (
            entry["bytes_ratio"] <= TARGETS["bytes_ratio_max"]
            and entry["teacher_forced_agreement"] >= TARGETS["agreement_min"]
            and abs(entry["ppl_change"]) <= TARGETS["ppl_change_max"]
        )
    return result


def print_table(result: dict[str, Any]) -> None:
    print(f"{'kv dtype':9} {'B/token':>8} {'ratio':>6} {'agree(tf)':>9} {'agree(free)':>11} "
          f"{'same':>5} {'ppl':>8} {'dppl':>7} {'blocks':>6} {'hit rate':>8} {'targets':>7}")
    for name in DTYPES:
        e = result[name]
        print(f"{name:9} {e['bytes_per_token']:8d} {e['bytes_ratio']:6.3f} "
              f"{e['teacher_forced_agreement']:9.3f} {e['free_running_position_agreement']:11.3f} "
              f"{e['identical_completions']:5d} {e['perplexity']:8.3f} {e['ppl_change']:+7.2%} "
              f"{e['rag']['num_blocks']:6d} {e['rag']['hit_rate']:8.3f} "
              f"{'ok' if e['meets_targets'] else 'MISS':>7}")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--prompts", type=int, default=20)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--text-tokens", type=int, default=1024)
    parser.add_argument("--text-segments", type=int, default=2)
    parser.add_argument("--docs", type=int, default=8)
    parser.add_argument("--doc-sentences", type=int, default=12)
    parser.add_argument("--requests", type=int, default=40)
    parser.add_argument("--cache-tokens", type=int, default=1536,
                        help="KV memory of every engine, in tokens of the bf16 pool")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--quick", action="store_true", help="small sizes, for smoke tests")
    parser.add_argument("--out", type=Path, default=Path("results/kv_quant.json"))
    args = parser.parse_args(argv)
    if args.quick:
        args.prompts, args.new_tokens, args.text_tokens, args.text_segments = 4, 8, 64, 4
        args.docs, args.doc_sentences, args.requests, args.cache_tokens = 4, 6, 10, 512
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    result = run(args)
    print_table(result)
    result["config"]["out"] = str(args.out)
    write_json(args.out, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
