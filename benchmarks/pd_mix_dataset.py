"""The prefill/decode benchmark's workload as JSONL for `cadence bench serve --dataset-name
jsonl`: short chats with a few long prompts among them (issue 20).

    python benchmarks/pd_mix_dataset.py OUT.jsonl [--num 400] [--long-frac 0.05]
        [--long-len 8000] [--short-len 256] [--output-len 128] [--tokenizer DIR]

Prompts are random ordinary tokens of SmolLM2's tokenizer (default), decoded to text that
re-encodes to the stated length; the long ones are spread evenly through the file.
"""

from __future__ import annotations

import argparse
import json
import random

from cadence.bench.datasets import ordinary_token_ids, text_of_length
from cadence.loader.model_path import resolve_model_path
from cadence.tokenizer import load_tokenizer


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out")
    ap.add_argument("--num", type=int, default=400)
    ap.add_argument("--long-frac", type=float, default=0.05)
    ap.add_argument("--long-len", type=int, default=8000)
    ap.add_argument("--short-len", type=int, default=256)
    ap.add_argument("--output-len", type=int, default=128)
    ap.add_argument("--tokenizer", default=None)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    tok = load_tokenizer(args.tokenizer or resolve_model_path(None))
    vocab = ordinary_token_ids(tok)
    rng = random.Random(args.seed)
    every = round(1 / args.long_frac) if args.long_frac > 0 else 0
    with open(args.out, "w") as f:
        for i in range(args.num):
            n = args.long_len if every and i % every == every // 2 else args.short_len
            text, _ = text_of_length(tok, [rng.choice(vocab) for _ in range(n)], vocab, rng)
            f.write(json.dumps({"prompt": text, "max_tokens": args.output_len}) + "\n")


if __name__ == "__main__":
    main()
