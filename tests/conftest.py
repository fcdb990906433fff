"""Shared fixtures: tiny random models of each supported architecture, built once per test
session with transformers itself and saved as ordinary checkpoint folders."""

from __future__ import annotations

import os
import zlib

import pytest
import torch
from model_helpers import build_tiny

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """tiny_model_dir(kind) -> path of a saved random model of that architecture."""
    cache: dict[str, str] = {}

    def make(kind: str) -> str:
        if kind not in cache:
            config, cls = build_tiny(kind)
            torch.manual_seed(zlib.crc32(kind.encode()))  # stable across processes
            model = cls(config).eval()
            path = tmp_path_factory.mktemp(f"tiny-{kind}")
            model.save_pretrained(path)
            cache[kind] = str(path)
        return cache[kind]

    return make


@pytest.fixture(scope="session")
def hf_model():
    """hf_model(path) -> the transformers model in float32, loaded once per path."""
    cache = {}

    def load(path: str):
        if path not in cache:
            from transformers import AutoModelForCausalLM

            cache[path] = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
        return cache[path]

    return load
