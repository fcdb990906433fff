"""Start-up compiles every kernel variant: after the engine is built, a mixed workload
launches no Triton kernel variant that warm-up did not (each would be a compile in the
middle of serving on a GPU). Under Triton's interpreter, in a child process (the variable
must be set before triton is imported); tests/triton_specs.py computes the variant keys from
each launch's arguments and skips the kernels' arithmetic (the numbers are tested elsewhere,
the variants depend only on shapes, dtypes and constexprs)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("triton", reason="triton is not installed")

CHECK = """
import sys, json, tempfile, zlib
sys.path.insert(0, {tests!r})
import torch
from model_helpers import build_tiny, make_prompts
from triton_specs import SpecRecorder
from cadence import LLM, SamplingParams

config, cls = build_tiny({kind!r})
config.max_position_embeddings = 4096  # (the workload's long prompts)
torch.manual_seed(zlib.crc32({kind!r}.encode()))
path = tempfile.mkdtemp()
cls(config).eval().save_pretrained(path)
recorder = SpecRecorder().install(execute=False)
llm = LLM(path, dtype="bfloat16", attention_backend="triton", num_gpu_blocks_override=400,
          max_num_batched_tokens=256, max_num_seqs=40)
warm = set(recorder.keys)
warm_launches = dict(recorder.launches)

# The workload: a long shared prefix (its decodes pass split_min_context: 9 of them split
# into a partition count warm-up never used), prefix-cache hits, chunked prefills mixed
# with decodes, short prompts of many lengths, 36 decodes at once, sampling with seeds.
prefix = make_prompts(512, [1040], seed=2)[0]
long_prompts = [prefix + p for p in make_prompts(512, [3 + i for i in range(10)], seed=3)]
short = make_prompts(512, [1, 2, 3, 15, 16, 17, 63, 64, 65, 130, 300], seed=4)
many = make_prompts(512, [5 + i % 7 for i in range(36)], seed=5)
greedy = SamplingParams(temperature=0, max_tokens=3, ignore_eos=True)
sampled = SamplingParams(temperature=0.8, top_p=0.9, seed=1, max_tokens=3, ignore_eos=True)
for batch, params in ((long_prompts[:1], greedy), (long_prompts[1:], greedy), (short, greedy),
                      (many, sampled), (short[:4] + long_prompts[:2], sampled)):
    llm.generate([{{"prompt_token_ids": p}} for p in batch], params, use_tqdm=False)
new = recorder.keys - warm
print(json.dumps({{
    "split_launches": recorder.launches.get("split_kv_kernel", 0)
                      - warm_launches.get("split_kv_kernel", 0),
    "warm": sorted({{k[0] for k in warm}}),
    "num_warm": len(warm),
    "new": [str(k) for k in new],
}}))
"""


def _variants_after_warm_up(kind: str) -> dict:
    tests = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    proc = subprocess.run(
        [sys.executable, "-c", CHECK.format(tests=tests, kind=kind)],
        env={**os.environ, "TRITON_INTERPRET": "1"},
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.slow  # a whole engine under Triton's interpreter
def test_no_latent_attention_variant_appears_after_warm_up():
    """DeepSeek's latent-attention kernel: decodes of every batch size share one variant
    per tile (the key-split count is a runtime value), prefill chunks of any length one."""
    report = _variants_after_warm_up("deepseek-v2")
    assert report["warm"] == ["mla_attention_kernel", "mla_reduce_kernel", "write_kv_kernel"]
    assert report["new"] == []


@pytest.mark.slow  # a whole engine under Triton's interpreter
def test_no_kernel_variant_appears_after_warm_up():
    report = _variants_after_warm_up("llama-long")
    assert report["warm"] == [
        "paged_attention_kernel",
        "split_kv_kernel",
        "split_kv_reduce_kernel",
        "write_kv_kernel",
    ]
    # kernel B: prefill/mixed tile, decode-small, decode-large; A, C and the reduce: one each
    assert report["num_warm"] == 6, report
    assert report["split_launches"] >= 8  # the long decodes did take the split path
    assert report["new"] == []
