"""Greedy steps through the output head's int8 screen against the full bf16 head.

SmolLM2 in bf16 on CPU (a 56 MB head). Two measurements, the two sides alternating:

* the head alone on hidden states of real greedy steps, 1-4 rows, its caches cold as they are
  after a forward pass (a 64 MB buffer is written between calls): ``CausalLM.greedy_tokens``
  (the screen) against ``compute_logits`` + argmax (the full head);
* one engine, the screen on and off (``CausalLM.use_greedy_screen``): decode time per token
  of one sequence after a 1,637-token cached prompt, and warm TTFT of 64 new tokens over it.

Both give the same tokens (tested). Medians; also how many strips of 64 columns the screen
leaves to compute exactly.

    python benchmarks/greedy_head.py [--rounds 6] [--threads 2] [--quick]
                                     [--out results/greedy_head.json]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from bench_report import write_json
from engine_bench import text_tokens, timed_first_token

from prefixcache.engine import LLM, SamplingParams
from prefixcache.kernels.cpu.greedy_screen import strips_left

ROWS = (1, 2, 3, 4)


def captured_hidden(llm: LLM) -> torch.Tensor:  # [steps, hidden] bf16
    """The final hidden states of the rows greedy steps sampled, on a few real prompts."""
    model = llm.engine.runner.model
    greedy_tokens = model.greedy_tokens
    rows: list[torch.Tensor] = []

    def capture(hidden: torch.Tensor) -> torch.Tensor:
        rows.append(hidden.clone())
        return greedy_tokens(hidden)

    model.greedy_tokens = capture
    prompts = ["Write a short poem about the sea.", "What is 17 * 23?", "Name three trees."]
    llm.generate(prompts, SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True))
    del model.greedy_tokens  # the class's method again
    return torch.cat(rows)


def head_times(llm: LLM, hidden: torch.Tensor, rounds: int) -> dict:
    model = llm.engine.runner.model
    flush = torch.ones(16 * 1024 * 1024)  # 64 MB written between calls: the head leaves L3
    report = {}
    for rows in ROWS:
        times: dict[str, list[float]] = {"screen": [], "full": []}
        for round_index in range(rounds * 3):
            start_row = (round_index * rows) % (hidden.shape[0] - rows)
            x = hidden[start_row : start_row + rows].contiguous()
            tokens = {}
            for side in ("screen", "full"):
                flush.add_(1.0)
                start = time.perf_counter()
                if side == "screen":
                    tokens[side] = model.greedy_tokens(x)
                else:
                    tokens[side] = model.compute_logits(x).argmax(dim=-1)
                times[side].append(time.perf_counter() - start)
            assert torch.equal(tokens["screen"], tokens["full"])
        med = {side: statistics.median(v) for side, v in times.items()}
        report[str(rows)] = {
            "screen_ms": med["screen"] * 1e3,
            "full_ms": med["full"] * 1e3,
            "screen_over_full": med["screen"] / med["full"],
        }
    screen, packed = model.greedy_screen, model.lm_head.packed
    left = [strips_left(hidden[i : i + 1], screen, packed) for i in range(hidden.shape[0])]
    report["strips"] = screen.q.shape[0]
    report["strips_left_one_row"] = {
        "median": statistics.median(left), "max": max(left), "steps": len(left)
    }
    return report


def engine_times(llm: LLM, rounds: int, prompt_tokens: int, new_tokens: int) -> dict:
    """The same engine with the screen on and off (``use_greedy_screen``), alternating."""
    model = llm.engine.runner.model
    prompt = text_tokens(llm, prompt_tokens, 1)
    llm.warm(prompt)
    decode = SamplingParams(max_tokens=new_tokens + 1, temperature=0.0, ignore_eos=True)
    samples = {side: {"tpot_s": [], "warm_ttft_s": []} for side in ("screen", "full")}
    suffix_seed = iter(range(1000, 100_000))
    try:
        for round_index in range(rounds):
            order = ("screen", "full") if round_index % 2 == 0 else ("full", "screen")
            for side in order:
                model.use_greedy_screen = side == "screen"
                samples[side]["tpot_s"].append(llm.generate([prompt], decode)[0].metrics.tpot)
                suffix = text_tokens(llm, 64, next(suffix_seed))  # never cached
                samples[side]["warm_ttft_s"].append(timed_first_token(llm, prompt + suffix))
    finally:
        model.use_greedy_screen = True
    report: dict = {
        side: {name: statistics.median(v) for name, v in values.items()}
        for side, values in samples.items()
    }
    for name in ("tpot_s", "warm_ttft_s"):
        report[f"{name}_screen_over_full"] = report["screen"][name] / report["full"][name]
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, default=Path("results/greedy_head.json"))
    parser.add_argument("--quick", action="store_true", help="one round, a 256-token prompt")
    args = parser.parse_args()
    prompt_tokens, new_tokens = 1637, 32
    if args.quick:
        args.rounds, prompt_tokens, new_tokens = 1, 256, 8
    torch.set_num_threads(args.threads)
    llm = LLM()
    report: dict = {"threads": args.threads, "rounds": args.rounds, "quick": args.quick}
    report["head"] = head_times(llm, captured_hidden(llm), args.rounds)
    for rows, row in report["head"].items():
        if not isinstance(row, dict) or "screen_ms" not in row:
            continue
        print(
            f"head, {rows} row{'s' if rows != '1' else ' '}:   screen {row['screen_ms']:5.2f} ms   "
            f"full {row['full_ms']:5.2f} ms   ratio {row['screen_over_full']:.2f}"
        )
    left = report["head"]["strips_left_one_row"]
    print(
        f"strips of 64 columns left to compute exactly, one row: median {left['median']}, "
        f"max {left['max']} of {report['head']['strips']} ({left['steps']} greedy steps)"
    )
    report["engine"] = engine_times(llm, args.rounds, prompt_tokens, new_tokens)
    engine = report["engine"]
    for name, label in (("tpot_s", "decode per token  "), ("warm_ttft_s", "warm TTFT (64 new)")):
        print(
            f"{label}: screen {engine['screen'][name] * 1e3:6.2f} ms   full "
            f"{engine['full'][name] * 1e3:6.2f} ms   ratio {engine[f'{name}_screen_over_full']:.3f}"
        )
    write_json(args.out, report)


if __name__ == "__main__":
    main()
