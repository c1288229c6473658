"""What keeping a streamed request's text up to date costs per token: the engine's
``SequenceText`` decoding only the new tokens (byte-level tokenizers) against decoding the whole
output every step, side by side on the same outputs with SmolLM2's tokenizer.

Each token is appended, the text updated and a stop string searched for (``check_stop`` with a
stop string that never appears, as a streaming request with ``stop`` pays every step). Two
outputs: English-like text (every token ends a character) and text with CJK characters and
emoji (tokens end mid-character, so text is held back). Medians of the rounds; microseconds a
token and the ratio.

    python benchmarks/stream_text.py [--rounds 5] [--quick] [--out results/stream_text.json]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from bench_report import write_json
from engine_bench import text_tokens

from prefixcache.engine import LLM, SamplingParams
from prefixcache.engine.request import Request
from prefixcache.engine.stop_checker import SequenceText, check_stop
from prefixcache.engine.tokenizer import Tokenizer

MIXED_TEXT = "naïve café 日本語のテキスト 😀👩‍👧 données 中文 emoji 🚀 done. "


def outputs(llm: LLM, length: int) -> dict[str, list[int]]:
    """``length`` output ids of each kind."""
    mixed = llm.tokenizer.encode(MIXED_TEXT * (length // 8 + 1))[:length]
    return {"english": text_tokens(llm, length, 3), "mixed": mixed}


def seconds_per_token(tokenizer: Tokenizer, ids: list[int], prefix_stable: bool) -> float:
    """One streamed request's text kept up to date over ``ids``, a stop string searched every
    step; seconds a token."""
    params = SamplingParams(max_tokens=len(ids), stop=["<never appears>"], ignore_eos=True)
    request = Request("stream", [1], params)
    text = SequenceText(tokenizer.decode, prefix_stable)
    start = time.perf_counter()
    for token in ids:
        request.append_token(token)
        check_stop(request, text, eos_token_ids=(), max_model_len=1 << 30)
    elapsed = time.perf_counter() - start
    assert text.text == tokenizer.decode(ids).removesuffix("\ufffd")
    return elapsed / len(ids)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", type=Path, default=Path("results/stream_text.json"))
    parser.add_argument("--quick", action="store_true", help="one round, short outputs")
    args = parser.parse_args()
    lengths = [64, 256] if args.quick else [256, 1024, 4096]
    rounds = 1 if args.quick else args.rounds
    llm = LLM()
    tokenizer = llm.tokenizer
    assert tokenizer.decode_concatenates
    report: dict = {"rounds": rounds, "quick": args.quick, "results": {}}
    print(f"{'output':>16} {'new tokens':>12} {'whole':>10} {'ratio':>7}  (us a token)")
    for length in lengths:
        for kind, ids in outputs(llm, length).items():
            times: dict[str, list[float]] = {"new_tokens": [], "whole": []}
            for round_index in range(rounds):
                order = (True, False) if round_index % 2 == 0 else (False, True)
                for prefix_stable in order:
                    side = "new_tokens" if prefix_stable else "whole"
                    times[side].append(seconds_per_token(tokenizer, ids, prefix_stable))
            med = {side: statistics.median(values) * 1e6 for side, values in times.items()}
            ratio = med["new_tokens"] / med["whole"]
            report["results"][f"{kind}_{length}"] = {
                "tokens": length, "new_tokens_us": med["new_tokens"], "whole_us": med["whole"],
                "new_over_whole": ratio,
            }  # fmt: skip
            print(f"{kind + ' ' + str(length):>16} {med['new_tokens']:12.2f} {med['whole']:10.2f}"
                  f" {ratio:7.3f}")  # fmt: skip
    write_json(args.out, report)


if __name__ == "__main__":
    main()
