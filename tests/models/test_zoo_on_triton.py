"""The Triton attention kernels inside a whole model of the zoo, on the CPU: Gemma 2's
interleaved sliding windows and soft-capped scores, Qwen3's per-head q / k norms (applied
by the backend's kernel A as it rotates), and DeepSeek-V3's latent attention, give
transformers' greedy tokens in float32 with chunked prefill beside decodes. (Head dims that are not powers of two have
their interpreter cases in tests/attention/test_triton_paged.py, and a whole model with
one, Mistral at head dim 24, runs on the GPU in tests/worker/test_cuda_runner.py.)

The kernels run under Triton's interpreter in a child process (tests/interpreter_child.py):
this process builds the models and transformers' tokens, the child serves the same
prompts with `attention_backend="triton"` and prints what it generated. The GPU runs the
same families with compiled kernels and CUDA graphs (tests/worker/test_cuda_runner.py).
"""

from __future__ import annotations

import json
import os
import sys

import pytest
from interpreter_child import interpreter_report
from model_helpers import WINDOW, hf_greedy, make_prompts

KINDS = ["gemma2", "qwen3", "deepseek-v3"]  # (and DeepSeek's latent attention: triton_mla.py)
LENGTHS = [3, 2 * WINDOW + 5, 40]
NEW_TOKENS = 6


@pytest.fixture(scope="module")
def triton_tokens(tiny_model_dir) -> dict:
    paths = {kind: tiny_model_dir(kind) for kind in KINDS}
    return interpreter_report(__file__, json.dumps(paths))


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.slow  # whole engines under Triton's interpreter
def test_zoo_on_the_triton_kernels_equals_transformers(
    kind, tiny_model_dir, hf_model, triton_tokens
):
    model = hf_model(tiny_model_dir(kind))
    prompts = make_prompts(512, LENGTHS, seed=11)
    expected = [hf_greedy(model, p, NEW_TOKENS) for p in prompts]
    got = triton_tokens[kind]
    assert got["backend"] == "triton"
    assert got["backend_norms"] == (kind == "qwen3")  # kernel A norms Qwen3's heads
    assert got["tokens"] == expected


def _child(paths: dict[str, str]) -> None:
    import torch

    import cadence.worker.model_runner
    from cadence import LLM, SamplingParams

    # No start-up warm-up (every kernel variant launched once: seconds of interpreted
    # kernels that check nothing here); tests/worker/test_warmup.py checks it.
    cadence.worker.model_runner.warm_up = lambda runner: 0.0
    torch.set_num_threads(1)
    params = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True)
    prompts = [{"prompt_token_ids": p} for p in make_prompts(512, LENGTHS, seed=11)]
    report = {}
    for kind, path in paths.items():
        # A 16-token budget chunks the longer prompts beside the others' decodes.
        llm = LLM(
            path,
            dtype="float32",
            attention_backend="triton",
            max_num_batched_tokens=16,
            block_size=4,
            num_gpu_blocks_override=64,
        )
        outs = llm.generate(prompts, params, use_tqdm=False)
        model = llm.engine.runner.driver.model
        report[kind] = {
            "backend": llm.engine.runner.driver.backend.name,
            "backend_norms": any(getattr(m, "backend_norms", False) for m in model.modules()),
            "tokens": [o.outputs[0].token_ids for o in outs],
        }
    print(json.dumps(report))


if __name__ == "__main__" and sys.argv[1:2] == ["--interpreter-cases"]:
    assert os.environ.get("TRITON_INTERPRET") == "1"
    _child(json.loads(sys.argv[2]))
