"""The model runner with the Triton attention backend, end to end on the CPU through
Triton's interpreter: greedy float32 tokens equal transformers, prefill chunks and decodes
mixed in one step, and long prompts whose decodes take the split-KV path. (On CUDA the
same is checked, with graphs, in test_cuda_runner.py.)"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytest.importorskip("triton", reason="triton is not installed")

# Both engines are built without the start-up warm-up: it launches every kernel variant
# once, which interpreted costs about a minute per engine and adds nothing to what is
# checked here (tests/worker/test_warmup.py builds an engine with it and checks what it
# launches).
NO_WARM_UP = """
import cadence.worker.model_runner
cadence.worker.model_runner.warm_up = lambda runner: 0.0
"""

CHECK = """
import sys, zlib, tempfile
sys.path.insert(0, {tests!r})
import torch
from model_helpers import build_tiny, make_prompts, hf_greedy
from cadence import LLM, SamplingParams
{no_warm_up}
config, cls = build_tiny("llama")
torch.manual_seed(zlib.crc32(b"llama"))
model = cls(config).eval()
path = tempfile.mkdtemp()
model.save_pretrained(path)
prompts = make_prompts(512, [3, 9, 21], seed=1)
expected = [hf_greedy(model, p, 5) for p in prompts]
# A budget of 8 tokens: prefill chunks and decodes share steps.
llm = LLM(path, dtype="float32", attention_backend="triton", num_gpu_blocks_override=64,
          max_num_batched_tokens=8)
assert llm.engine.runner.driver.backend.name == "triton"
outs = llm.generate([{{"prompt_token_ids": p}} for p in prompts],
                    SamplingParams(temperature=0, max_tokens=5, ignore_eos=True), use_tqdm=False)
got = [o.outputs[0].token_ids for o in outs]
assert got == expected, (got, expected)
"""


# A prompt past split_min_context decodes split-KV, alone and beside a short one, after a
# chunked prefill. The thresholds are scaled down (1024 -> 64 keys, partitions 256 -> 16):
# the same path, at a length Triton's interpreter runs in seconds, not a minute. (By
# keyword: the backend's constructor has gained parameters after these two.)
LONG_CHECK = """
import sys, zlib, tempfile
sys.path.insert(0, {tests!r})
import torch
from model_helpers import build_tiny, make_prompts, hf_greedy
from cadence import LLM, SamplingParams
from cadence.attention.triton_paged import TritonAttentionBackend
{no_warm_up}
init = TritonAttentionBackend.__init__

def scaled_down(self, *args, **kwargs):
    kwargs.setdefault("split_min_partition", 16)
    kwargs.setdefault("split_min_context", 64)
    init(self, *args, **kwargs)

TritonAttentionBackend.__init__ = scaled_down

config, cls = build_tiny("llama-long")
torch.manual_seed(zlib.crc32(b"llama-long"))
model = cls(config).eval()
path = tempfile.mkdtemp()
model.save_pretrained(path)
prompts = make_prompts(512, [100, 7], seed=6)
expected = [hf_greedy(model, p, 4) for p in prompts]
llm = LLM(path, dtype="float32", attention_backend="triton", num_gpu_blocks_override=120,
          max_num_batched_tokens=512)
splits = []
backend = llm.engine.runner.driver.backend
assert (backend.split_min_partition, backend.split_min_context) == (16, 64)
build = backend.build
backend.build = lambda meta: splits.append(build(meta).backend_data.split_req.numel()) or meta
params = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
got = [llm.generate({{"prompt_token_ids": p}}, params, use_tqdm=False)[0].outputs[0].token_ids
       for p in prompts[:1]]
got += [o.outputs[0].token_ids for o in llm.generate(
    [{{"prompt_token_ids": p}} for p in prompts], params, use_tqdm=False)]
assert got == expected[:1] + expected, (got, expected)
assert max(splits) >= 1, splits
"""


@pytest.mark.parametrize(
    "script",
    [
        CHECK,
        LONG_CHECK,
    ],
    ids=["mixed", "long_split_kv"],
)
@pytest.mark.slow  # a whole engine under Triton's interpreter
def test_triton_backend_in_the_engine_under_the_interpreter(script):
    tests = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    proc = subprocess.run(
        [sys.executable, "-c", script.format(tests=tests, no_warm_up=NO_WARM_UP)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]


def test_triton_backend_needs_cuda_outside_the_interpreter(monkeypatch, tiny_model_dir):
    import torch

    from cadence import LLM

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA: the triton backend is allowed here")
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(ValueError, match="needs a CUDA device"):
        LLM(tiny_model_dir("llama"), attention_backend="triton", num_gpu_blocks_override=8)
