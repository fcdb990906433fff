"""Issue 16, CPU: n-gram speculation on copy-heavy prompts and on plain chat, SmolLM2.

For each prompt set (copy-heavy: edit a paragraph, extract quoted lines, refactor a
function, ...; chat: open questions) and concurrency (1: one request at a time; 8: eight
at once), greedy chat completions of up to 128 tokens run with speculation off and on, in
one process (the engines load once each and are warmed up). Reported per cell: output
tok/s (output tokens / wall time, prefill included), decode tok/s (output tokens after the
first / time after each request's first token, summed over requests at concurrency 1), the
mean acceptance length (tokens per verification) and the draft acceptance rate.

    python benchmarks/spec_decode_cpu.py [--configs 4:2,6:1] [--json out.json]

`--configs` lists the n-gram settings to compare with speculation off, as k:prompt_lookup_min
(prompt_lookup_max stays 5).
"""

from __future__ import annotations

import argparse
import json
import time

COPY_HEAVY = [
    "Fix the spelling mistakes in this paragraph and return the whole corrected paragraph:\n"
    "The libary will be closed on Tuesday becuase of the anual inventory. Members who have "
    "books due that day can return them on Wednesday without a fine. The reading room will "
    "reopen on Thursday morning at nine, and the childrens section will have new books.",
    "Extract the quoted lines from this text, one per line:\n"
    'She said "the train leaves at noon" and then added "do not be late again". Later the '
    'conductor shouted "all aboard" while a child asked "where are we going".',
    "Rename the variable x to total in this function and return the whole function:\n"
    "def add_all(items):\n    x = 0\n    for item in items:\n        x = x + item\n"
    "    if x > 100:\n        print('large', x)\n    return x\n",
    "Convert this list to a numbered list, keeping every word:\n- buy milk and eggs\n"
    "- call the plumber about the kitchen sink\n- send the report to Maria\n"
    "- book the train tickets for Friday\n- water the plants on the balcony\n",
    "Repeat the following address exactly, then say thank you:\n221B Baker Street, "
    "London NW1 6XE, United Kingdom. Phone: +44 20 7224 3688.",
    "Make this sentence formal and return the full paragraph: Hey team, the meeting is "
    "moved to three, bring the slides, and don't forget the budget numbers for Q3, thanks.",
    "Add type hints to this Python function and return it:\n"
    "def scale(values, factor):\n    result = []\n    for v in values:\n"
    "        result.append(v * factor)\n    return result\n",
    "Copy this table as CSV with the same rows:\nname | age | city\nAnna | 31 | Oslo\n"
    "Ben | 45 | Lyon\nChen | 28 | Taipei\nDara | 52 | Cork\n",
]
CHAT = [
    "What are three good habits for staying healthy?",
    "Explain what a black hole is to a ten-year-old.",
    "Give me a short recipe idea for dinner tonight.",
    "Why is the sky blue?",
    "Write a two-sentence story about a lost cat.",
    "What should I pack for a weekend hiking trip?",
    "How do plants make their food?",
    "Suggest a name for a small coffee shop and explain it.",
]


def run_cell(llm, prompts, concurrency: int, max_tokens: int):
    from cadence import SamplingParams

    params = SamplingParams(temperature=0, max_tokens=max_tokens)
    convs = [[{"role": "user", "content": p}] for p in prompts]
    stats = llm.engine.scheduler.spec_stats
    before = (
        (stats.num_verifications, stats.num_draft_tokens, stats.num_accepted_tokens)
        if stats
        else None
    )
    t0 = time.perf_counter()
    outs = []
    for i in range(0, len(convs), concurrency):
        outs += llm.chat(convs[i : i + concurrency], params, use_tqdm=False)
    wall = time.perf_counter() - t0
    n_out = sum(len(o.outputs[0].token_ids) for o in outs)
    # decode time: from each request's first token to its end (batch 1 only: at 8 the
    # requests overlap, so the cell's wall time is the figure)
    decode = sum(o.metrics.last_token_time - o.metrics.first_token_time for o in outs)
    cell = {
        "output_tok_s": n_out / wall,
        "decode_tok_s": (n_out - len(outs)) / decode if concurrency == 1 and decode > 0 else None,
        "output_tokens": n_out,
        "wall_s": wall,
    }
    if stats:
        v = stats.num_verifications - before[0]
        d = stats.num_draft_tokens - before[1]
        a = stats.num_accepted_tokens - before[2]
        cell["acceptance_length"] = (a + v) / v if v else 0.0
        cell["acceptance_rate"] = a / d if d else 0.0
    return cell, [o.outputs[0].token_ids for o in outs]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--configs", default="4:2,6:1", help="k:prompt_lookup_min, comma-separated")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--json")
    args = ap.parse_args()

    from cadence import LLM

    common = {"dtype": "bfloat16", "kv_cache_memory": 512 * 2**20, "max_model_len": 2048}
    engines = {"off": LLM(**common)}
    for item in args.configs.split(","):
        k, n_min = (int(x) for x in item.split(":"))
        spec = {"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_min": n_min}
        engines[f"ngram k={k} n>={n_min}"] = LLM(**common, speculative_config=spec)
    for llm in engines.values():  # warm-up
        run_cell(llm, CHAT[:2], 2, 16)
    results = {}
    for set_name, prompts in (("copy-heavy", COPY_HEAVY), ("chat", CHAT)):
        for conc in (1, 8):
            for name, llm in engines.items():
                cell, _ = run_cell(llm, prompts, conc, args.max_tokens)
                results[f"{set_name} c{conc} {name}"] = cell
                print(f"{set_name:10s} c{conc} {name:16s} {json.dumps(cell)}", flush=True)
            off = results[f"{set_name} c{conc} off"]
            for name in list(engines)[1:]:
                on = results[f"{set_name} c{conc} {name}"]
                line = f"output {on['output_tok_s'] / off['output_tok_s']:.2f}x"
                if conc == 1:
                    line += f", decode {on['decode_tok_s'] / off['decode_tok_s']:.2f}x"
                print(f"{set_name:10s} c{conc} {name:16s} speedup {line}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
