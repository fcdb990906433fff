"""Shared fixtures: tiny random models of each supported architecture, built once per test
session with transformers itself and saved as ordinary checkpoint folders; one real
`cadence serve` of SmolLM2 shared by the server tests (tests/entrypoints, tests/robustness)."""

from __future__ import annotations

import os
import zlib

import httpx
import pytest
import torch
from model_helpers import build_tiny
from server_helper import API_KEY, Server, worker_threads

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# Under pytest-xdist (make test) the cores are shared between the workers.
torch.set_num_threads(worker_threads())
os.environ.setdefault("OMP_NUM_THREADS", str(worker_threads()))  # scripts tests run as children


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """tiny_model_dir(kind) -> path of a saved random model of that architecture. Built once
    per run: under pytest-xdist the workers share one folder (the first builds, under a
    lock; the weights are seeded by the kind, so every build is the same)."""
    from filelock import FileLock

    shared = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        shared = shared.parent  # the run's folder, above each worker's own
    cache: dict[str, str] = {}

    def make(kind: str) -> str:
        if kind not in cache:
            path = shared / f"tiny-model-{kind}"
            with FileLock(str(path) + ".lock"):
                done = path / ".complete"
                if not done.exists():
                    config, cls = build_tiny(kind)
                    torch.manual_seed(zlib.crc32(kind.encode()))  # stable across processes
                    cls(config).eval().save_pretrained(path)
                    done.touch()
            cache[kind] = str(path)
        return cache[kind]

    return make


@pytest.fixture(scope="session")
def tiny_vision_model_dir(tmp_path_factory):
    """tiny_vision_model_dir(kind) -> a saved random vision-language model of that family
    with its processor and chat template (tests/vision_helpers.py), built once per run."""
    from filelock import FileLock
    from vision_helpers import save_tiny_vision_model

    shared = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        shared = shared.parent

    def make(kind: str) -> str:
        path = shared / f"tiny-vision-{kind}"
        with FileLock(str(path) + ".lock"):
            if not (path / ".complete").exists():
                torch.manual_seed(zlib.crc32(kind.encode()))
                save_tiny_vision_model(kind, str(path))
                (path / ".complete").touch()
        return str(path)

    return make


@pytest.fixture(scope="session")
def hf_model():
    """hf_model(path) -> the transformers model in float32, loaded once per path. Eager
    attention and experts (transformers' reference math): its SDPA path, where a release
    offers one for a family, may skip what SDPA cannot express (Gemma 2's soft-capped
    scores), and its default grouped-GEMM experts in transformers 5.17 read GPT-OSS's
    interleaved gate and up columns as two halves (5.24's do not)."""
    cache = {}

    def load(path: str):
        if path not in cache:
            from transformers import AutoModelForCausalLM

            cache[path] = AutoModelForCausalLM.from_pretrained(
                path,
                dtype=torch.float32,
                attn_implementation="eager",
                experts_implementation="eager",
            ).eval()
        return cache[path]

    return load


@pytest.fixture(scope="session")
def profile_dir(tmp_path_factory):
    """Where the shared server writes torch.profiler traces (POST /start_profile)."""
    return tmp_path_factory.mktemp("profiles")


@pytest.fixture(scope="session")
def server(profile_dir):
    """SmolLM2 in float32, with an API key, 8 sequences at once and 8 more queued, the last
    16 /v1/responses stored, Qwen3's reasoning parser."""
    srv = Server(
        [
            "--profile-dir",
            str(profile_dir),
            "--dtype",
            "float32",
            "--api-key",
            API_KEY,
            "--max-num-seqs",
            "8",
            "--max-num-waiting",
            "8",
            "--kv-cache-memory",
            str(512 * 2**20),
            "--max-model-len",
            "2048",
            "--responses-store-size",
            "16",
            "--reasoning-parser",
            "qwen3",  # SmolLM2 never opens <think> by itself: only forced outputs split
        ]
    )
    try:
        srv.wait_ready()
        yield srv
    finally:
        srv.stop()


@pytest.fixture(scope="session")
def http(server):
    with httpx.Client(
        base_url=server.url, headers={"Authorization": f"Bearer {API_KEY}"}, timeout=120
    ) as c:
        yield c


@pytest.fixture(scope="session")
def client(server):
    from openai import OpenAI

    return OpenAI(base_url=server.url + "/v1", api_key=API_KEY, max_retries=0, timeout=120)


@pytest.fixture(scope="session")
def model_name(http):
    return http.get("/v1/models").json()["data"][0]["id"]


def pytest_collection_modifyitems(config, items):
    """Files with slow tests run first. Under `--dist loadfile --no-loadscope-reorder` (make
    test) a file goes whole to the next free worker, in collection order: a long file
    collected last would end the run on one core while the other idles (longest first is
    the classic fix for that tail; xdist's own reorder puts the files with most tests first,
    which are the quick unit tests)."""
    slow_files = {item.path for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: item.path not in slow_files)  # stable: order kept within
