"""The transformers baseline for `cadence bench throughput`: the same prompts (same seed, same
generator, imported from cadence.bench.offline) through `AutoModelForCausalLM.generate`.

    python benchmarks/hf_baseline.py --num-prompts 64 --input-len 128 --output-len 128
    python benchmarks/hf_baseline.py --dataset mixed --num-prompts 64

How it runs: prompts in batches of --batch-size (default: all at once), in workload order,
left-padded with the pad token id and an attention mask; greedy; max_new_tokens =
min_new_tokens = the largest output length in the batch, so EOS cannot stop a row early (the
analogue of Cadence's ignore_eos). Where a batch's requested output lengths differ (the mixed
set), every row still runs to the batch's largest length: `generate` has no per-row
max_new_tokens. Only each prompt's own requested output tokens count as output; the extra
decode work is what a static batch costs, and it is reported as `padded_output_tokens`.

Figures use the same definitions as Cadence (cadence.bench.offline.throughput_figures):
total tokens/s = (prompt tokens + useful output tokens) / elapsed.
"""

from __future__ import annotations

import argparse
import sys
import time

import torch

from cadence.bench.offline import (
    add_workload_args,
    machine_info,
    print_throughput,
    sample_requests,
    throughput_figures,
    write_json,
)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description="Offline throughput of transformers' batched generate, on Cadence's "
        "benchmark workloads."
    )
    p.add_argument(
        "--model",
        default=None,
        help="checkpoint folder or .gguf file (default: Cadence's default, SmolLM2-135M-Instruct)",
    )
    p.add_argument(
        "--dtype",
        choices=("float32", "bfloat16", "float16"),
        default="float32",
        help="(default: float32)",
    )
    p.add_argument("--device", default="cpu", help="(default: cpu)")
    p.add_argument(
        "--batch-size",
        type=int,
        default=None,
        help="prompts per generate() call (default: all of them in one batch)",
    )
    p.add_argument(
        "--attn-implementation",
        default=None,
        help="transformers' attn_implementation (default: transformers' own choice, sdpa)",
    )
    p.add_argument(
        "--warmup",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="run one short generate before timing (default: on)",
    )
    p.add_argument("--json", metavar="PATH", help="also write the result as JSON to PATH")
    add_workload_args(p, seed_flag=True)
    args = p.parse_args(argv)
    if args.batch_size is not None and args.batch_size < 1:
        p.error(f"--batch-size must be positive, got {args.batch_size}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from cadence.loader.model_path import resolve_model_path

    path = resolve_model_path(args.model)
    dtype = getattr(torch, args.dtype)
    device = torch.device(args.device)
    t0 = time.perf_counter()
    kwargs = {"dtype": dtype}
    if args.attn_implementation:
        kwargs["attn_implementation"] = args.attn_implementation
    model = AutoModelForCausalLM.from_pretrained(path, **kwargs).to(device).eval()
    tokenizer = AutoTokenizer.from_pretrained(path)
    pad_id = tokenizer.pad_token_id
    if pad_id is None:
        eos = model.generation_config.eos_token_id
        pad_id = eos[0] if isinstance(eos, list) else eos
    print(
        f"loaded {path} ({args.dtype}, attention {model.config._attn_implementation}) "
        f"in {time.perf_counter() - t0:.1f} s",
        file=sys.stderr,
    )

    requests = sample_requests(args, model.config.vocab_size)
    batch_size = args.batch_size or len(requests)
    batches = [requests[i : i + batch_size] for i in range(0, len(requests), batch_size)]

    def run_batch(batch) -> int:
        """Generate for one batch; returns the output tokens generated (padding included)."""
        width = max(r.prompt_len for r in batch)
        ids = torch.full((len(batch), width), pad_id, dtype=torch.int64)
        mask = torch.zeros((len(batch), width), dtype=torch.int64)
        for i, r in enumerate(batch):
            ids[i, width - r.prompt_len :] = torch.tensor(r.prompt_token_ids)
            mask[i, width - r.prompt_len :] = 1
        new = max(r.output_len for r in batch)
        out = model.generate(
            input_ids=ids.to(device),
            attention_mask=mask.to(device),
            do_sample=False,
            max_new_tokens=new,
            min_new_tokens=new,
            pad_token_id=pad_id,
        )
        produced = out.shape[1] - width
        if produced != new:
            raise RuntimeError(f"generate made {produced} tokens, {new} were asked for")
        return produced * len(batch)

    with torch.inference_mode():
        if args.warmup:
            from cadence.bench.offline import BenchRequest

            run_batch([BenchRequest(list(range(1, 17)), 4)])
        start = time.perf_counter()
        padded = sum(run_batch(b) for b in batches)
        elapsed = time.perf_counter() - start

    useful = sum(r.output_len for r in requests)
    fig = throughput_figures(requests, elapsed, useful)
    result = {
        "benchmark": "throughput",
        "engine": "transformers",
        "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": machine_info(),
        "model": path,
        "dtype": args.dtype,
        "device": str(device),
        "attn_implementation": model.config._attn_implementation,
        "batch_size": batch_size,
        "workload": {
            "dataset": args.dataset,
            "num_prompts": args.num_prompts,
            "seed": args.seed,
            **(
                {
                    "input_len": args.input_len,
                    "output_len": args.output_len,
                    "random_range_ratio": args.random_range_ratio,
                }
                if args.dataset == "random"
                else {}
            ),
        },
        "padded_output_tokens": padded,
        **fig,
    }
    print_throughput("transformers generate throughput", fig)
    if padded != useful:
        print(
            f"decoded tokens:        {padded} ({padded - useful} beyond the requested lengths, "
            "not counted)"
        )
    if args.json:
        write_json(args.json, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
