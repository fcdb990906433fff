"""PEFT adapters over the tiny models, made once per test run (under pytest-xdist the
workers share them, as they share the models), and the oracle's greedy tokens."""

from __future__ import annotations

import os

import pytest
import torch
from lora_helpers import make_adapter, peft_model
from model_helpers import hf_greedy


@pytest.fixture(scope="session")
def lora_dir(tiny_model_dir, tmp_path_factory):
    """lora_dir(kind, name) -> a PEFT adapter folder of that shape over that tiny model."""
    from filelock import FileLock

    shared = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        shared = shared.parent

    def make(kind: str, name: str) -> str:
        out = shared / f"lora-{kind}"
        out.mkdir(exist_ok=True)
        with FileLock(str(out / f"{name}.lock")):
            return make_adapter(tiny_model_dir(kind), name, str(out))

    return make


@pytest.fixture(scope="session")
def peft_greedy(tiny_model_dir, lora_dir, hf_model):
    """peft_greedy(kind, name or None, prompts, n) -> transformers (+ peft)'s greedy tokens."""
    cache: dict = {}

    def run(kind: str, name: str | None, prompts: list[list[int]], n: int):
        key = (kind, name, tuple(map(tuple, prompts)), n)
        if key not in cache:
            base = tiny_model_dir(kind)
            model = hf_model(base) if name is None else peft_model(base, lora_dir(kind, name))
            with torch.inference_mode():
                cache[key] = [hf_greedy(model, p, n) for p in prompts]
        return cache[key]

    return run
