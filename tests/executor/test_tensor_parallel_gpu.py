"""Tensor parallelism on two GPUs (NCCL, and the one-shot all-reduce for small messages):
greedy float32 tokens equal one GPU's and transformers', with CUDA graphs and without.
Each two-GPU engine runs in a process of its own (tp_child.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
from tp_helpers import greedy, hf_reference, prompts_for

from cadence import LLM

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        not torch.cuda.is_available() or torch.cuda.device_count() < 2,
        reason="needs two CUDA devices",
    ),
]

GPU = dict(dtype="float32", device="cuda", num_gpu_blocks_override=256)
CHILD = os.path.join(os.path.dirname(__file__), "tp_child.py")


def run_child(path: str, prompts, max_tokens: int, **kwargs) -> dict:
    """The child's result, and its exit code as "returncode"."""
    job = {"path": path, "prompts": prompts, "max_tokens": max_tokens, "kwargs": kwargs}
    proc = subprocess.run(
        [sys.executable, CHILD, json.dumps(job)], capture_output=True, text=True, timeout=240
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert lines, proc.stderr[-3000:]
    return {**json.loads(lines[-1].removeprefix("RESULT ")), "returncode": proc.returncode}


@pytest.mark.parametrize("kind", ["llama", "qwen3", "llama-mqa"])
@pytest.mark.parametrize("eager", [False, True], ids=["graphs", "eager"])
def test_two_gpus_equal_one_and_transformers(kind, eager, tiny_model_dir, hf_model):
    path = tiny_model_dir(kind)
    prompts = prompts_for(path) + prompts_for(path)[:1]
    expected = hf_reference(hf_model(path), prompts, 24)
    with LLM(path, enforce_eager=eager, **GPU) as one:
        assert greedy(one, prompts, 24) == expected
    two = run_child(path, prompts, 24, tensor_parallel_size=2, enforce_eager=eager, **GPU)
    assert two["returncode"] == 0  # and it shut down cleanly
    assert two["tokens"] == expected
    assert two["one_shot"]  # small all-reduces took the one-shot kernel
    assert (two["graph_replays"] > 0) == (not eager)


def test_prefill_graphs_under_tp(tiny_model_dir, hf_model):
    """--cuda-graph-prefill: prefill and mixed steps replay graphs that hold the one-shot
    all-reduces too."""
    path = tiny_model_dir("llama")
    prompts = prompts_for(path) + prompts_for(path)[:1]
    two = run_child(path, prompts, 24, tensor_parallel_size=2, cuda_graph_prefill=True, **GPU)
    assert two["returncode"] == 0
    assert two["mixed_graph_replays"] > 0
    assert two["tokens"] == hf_reference(hf_model(path), prompts, 24)


@pytest.fixture(scope="module")
def nccl_only(tiny_model_dir):
    path = tiny_model_dir("llama")
    prompts = prompts_for(path)
    kw = dict(tensor_parallel_size=2, disable_custom_all_reduce=True, **GPU)
    return path, prompts, run_child(path, prompts, 24, **kw)


def test_nccl_only_equals_transformers(nccl_only, hf_model):
    path, prompts, two = nccl_only
    assert not two["one_shot"]
    assert two["graph_replays"] > 0  # NCCL's all-reduces captured in the decode graphs
    assert two["tokens"] == hf_reference(hf_model(path), prompts, 24)


@pytest.mark.xfail(
    strict=True,
    reason="known, cause not found: with every all-reduce through NCCL (captured in CUDA "
    "graphs), leaving the NCCL group at shutdown never returns; after 10 s it is abandoned "
    "and the process aborts at exit (SIGABRT). Tokens are right (the test above).",
)
def test_nccl_only_shuts_down_cleanly(nccl_only):
    assert nccl_only[2]["returncode"] == 0
