"""Structured outputs on SmolLM2: what a grammar costs a decoded token, what a grammar costs to
compile, and the TTFT of a tool-calling agent turn over a long cached tool-schema prefix.

1. Per-token cost: ``--batch`` sizes of requests decode ``--tokens`` tokens each, greedy, free
   (the engine's greedy path: the int8 head screen), free with full logits (what a constrained
   row needs: the reference for the mask's own cost) and constrained by a JSON Schema whose
   string field is long enough that the grammar never ends first; and sampled (temperature
   0.8), free and constrained; rounds interleaved, medians. Target: constrained <= 1.1x free
   (with full logits, greedy), at batch 1 and 32.
2. Compile: a JSON Schema of a tool call compiled cold (a new schema each time) and again
   (the engine's grammar cache), and a matcher made from a cached grammar.
3. Agent turn: a conversation whose tools render to ~``--schema-tokens`` tokens; the next turn's
   TTFT (a required tool call, grammar-constrained) with the prefix cached vs recomputed.

    python benchmarks/structured_output.py [--rounds 5] [--out results/structured_output.json]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
from bench_report import write_json

from prefixcache.engine import LLM, SamplingParams
from prefixcache.engine.structured_output import StructuredOutput
from prefixcache.engine.tool_prompt import tool_call_grammar
from prefixcache.kernels.cpu.kernel_choice import cpu_model

LONG_TEXT = {"type": "object", "properties": {"story": {"type": "string", "minLength": 2000}},
             "required": ["story"]}  # fmt: skip


def per_token(llm: LLM, args: argparse.Namespace) -> dict[str, Any]:
    """Seconds per decoded token (whole batch / tokens) for each variant and batch size."""
    prompt = llm.encode(llm.render_chat([{"role": "user", "content": "Tell me a long story."}]))
    variants = {
        "free": SamplingParams(max_tokens=args.tokens, temperature=0.0, ignore_eos=True),
        "free, full logits": SamplingParams(max_tokens=args.tokens, temperature=0.0,
                                            ignore_eos=True, logprobs=0),
        "constrained": SamplingParams(max_tokens=args.tokens, temperature=0.0, ignore_eos=True,
                                      structured=StructuredOutput(json=LONG_TEXT)),
        "free, sampled": SamplingParams(max_tokens=args.tokens, temperature=0.8, seed=1,
                                        ignore_eos=True),
        "constrained, sampled": SamplingParams(max_tokens=args.tokens, temperature=0.8, seed=1,
                                               ignore_eos=True,
                                               structured=StructuredOutput(json=LONG_TEXT)),
    }  # fmt: skip
    results: dict[str, Any] = {}
    for batch in args.batch:
        prompts = [[*prompt, 100 + i] for i in range(batch)]  # distinct last tokens
        times: dict[str, list[float]] = {name: [] for name in variants}
        llm.generate(prompts, variants["constrained"])  # warm-up (and the prefix cached)
        for round_index in range(args.rounds):
            order = list(variants) if round_index % 2 == 0 else list(variants)[::-1]
            for name in order:
                start = time.perf_counter()
                outs = llm.generate(prompts, variants[name])
                seconds = time.perf_counter() - start
                tokens = sum(len(o.outputs[0].token_ids) for o in outs)
                times[name].append(seconds / tokens * batch)  # a step's time per token row
        medians = {name: statistics.median(values) for name, values in times.items()}
        results[str(batch)] = {
            "seconds_per_token": medians, "all": times,
            "constrained_over_full_logits": medians["constrained"] / medians["free, full logits"],
            "constrained_over_free": medians["constrained"] / medians["free"],
            "sampled_constrained_over_free": medians["constrained, sampled"] /
            medians["free, sampled"],
        }
    return results


def compile_times(llm: LLM, args: argparse.Namespace) -> dict[str, float]:
    tools = [{"type": "function", "function": {"name": f"tool_{i}", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}, "n": {"type": "integer"}},
        "required": ["city"]}}} for i in range(5)]
    cold, cached, matcher = [], [], []
    for round_index in range(args.rounds):
        tagged = [{"type": "function", "function": {**t["function"],
                                                    "name": f"tool_{i}_{round_index}"}}
                  for i, t in enumerate(tools)]  # a new schema: compiled cold
        spec = StructuredOutput(grammar=tool_call_grammar(tagged, "hermes"))
        start = time.perf_counter()
        llm.grammars.check(spec)
        cold.append(time.perf_counter() - start)
        start = time.perf_counter()
        llm.grammars.check(spec)
        cached.append(time.perf_counter() - start)
        start = time.perf_counter()
        llm.grammars.matcher(spec)
        matcher.append(time.perf_counter() - start)
    return {"cold_s": statistics.median(cold), "cached_s": statistics.median(cached),
            "matcher_s": statistics.median(matcher)}  # fmt: skip


def agent_turn(llm: LLM, args: argparse.Namespace) -> dict[str, Any]:
    words = "Looks the thing up in the company's records and returns what it finds. "
    tools, size = [], 0
    while size < args.schema_tokens:
        index = len(tools)
        tools.append({"type": "function", "function": {
            "name": f"lookup_{index}", "description": words * 4,
            "parameters": {"type": "object", "properties": {
                "query": {"type": "string", "description": f"what to look up ({index})"},
                "limit": {"type": "integer"}}, "required": ["query"]}}})  # fmt: skip
        size = len(llm.encode(llm.chat_template.render([], tools=tools)))
    grammar = tool_call_grammar(tools, "hermes", parallel=False)
    params = SamplingParams(max_tokens=1, temperature=0.0,
                            structured=StructuredOutput(grammar=grammar))  # fmt: skip
    scheduler = llm.engine.scheduler
    times: dict[str, list[float]] = {"cached": [], "recomputed": []}
    for round_index in range(args.rounds):
        history = [{"role": "user", "content": f"Find order {round_index}."}]
        turn = llm.encode(llm.chat_template.render(
            [*history, {"role": "user", "content": "And its invoice?"}], tools=tools))
        llm.generate([llm.encode(llm.chat_template.render(history, tools=tools))], params)
        for name in ("cached", "recomputed") if round_index % 2 == 0 else \
                ("recomputed", "cached"):  # fmt: skip
            scheduler.enable_prefix_caching = name == "cached"
            start = time.perf_counter()
            out = llm.generate([turn], params)[0]
            times[name].append(time.perf_counter() - start)
            scheduler.enable_prefix_caching = True
            if name == "cached" and out.num_cached_tokens < size - 64:
                raise RuntimeError(f"only {out.num_cached_tokens} of ~{size} tokens were cached")
    medians = {name: statistics.median(values) for name, values in times.items()}
    return {"tools": len(tools), "prefix_tokens": size, "prompt_tokens": len(turn),
            "ttft_s": medians, "cached_over_recomputed": medians["cached"] /
            medians["recomputed"]}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 32])
    parser.add_argument("--schema-tokens", type=int, default=4096)
    parser.add_argument("--quick", action="store_true",
                        help="a smoke run: 1 round, 4 tokens, batches 1 and 2, 256 prefix tokens")
    parser.add_argument("--out", default="results/structured_output.json")
    args = parser.parse_args()
    if args.quick:
        args.rounds, args.tokens, args.batch, args.schema_tokens = 1, 4, [1, 2], 256
    llm = LLM(kv_cache_memory=1 << 30)
    tokens = per_token(llm, args)
    for batch, row in tokens.items():
        m = row["seconds_per_token"]
        print(f"batch {batch}: ms per decode step of one row: free {m['free'] * 1e3:.2f}, free "
              f"with full logits {m['free, full logits'] * 1e3:.2f}, constrained "
              f"{m['constrained'] * 1e3:.2f}; constrained / full logits "
              f"{row['constrained_over_full_logits']:.3f} (target <= 1.1), / free "
              f"{row['constrained_over_free']:.3f}; sampled: constrained / free "
              f"{row['sampled_constrained_over_free']:.3f}", flush=True)  # fmt: skip
    compiled = compile_times(llm, args)
    print(f"a 5-tool call grammar: compile {compiled['cold_s'] * 1e3:.2f} ms cold, "
          f"{compiled['cached_s'] * 1e3:.3f} ms cached, a matcher "
          f"{compiled['matcher_s'] * 1e3:.2f} ms", flush=True)  # fmt: skip
    turn = agent_turn(llm, args)
    t = turn["ttft_s"]
    print(f"agent turn over {turn['tools']} tools ({turn['prefix_tokens']} prefix tokens, "
          f"{turn['prompt_tokens']} in all), a constrained call's first token: cached "
          f"{t['cached']:.3f} s, recomputed {t['recomputed']:.3f} s, ratio "
          f"{turn['cached_over_recomputed']:.3f}")  # fmt: skip
    write_json(args.out, {"args": vars(args), "per_token": tokens, "compile": compiled,
                          "agent_turn": turn, "cpu": cpu_model()})  # fmt: skip


if __name__ == "__main__":
    main()
