"""A slow grammar cannot hold the server (issue 14, point 6): past --grammar-compile-timeout
its request gets a 400 naming the bound, and constrained requests sent right after still
succeed, although the compile thread stays stuck in C++ behind them.

The model is a tiny random llama with SmolLM2's vocabulary (49152 tokens) and tokenizer: a
compile's cost grows with the vocabulary, and with the 512 tokens of the shared tiny models
even the slow grammars compile in time.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import httpx
import pytest
from server_helper import Server

sys.path.insert(0, str(Path(__file__).parent.parent / "structured"))
from slow_grammars import HOSTNAME_LIKE  # noqa: E402

pytestmark = pytest.mark.slow  # starts servers of its own (make test-fast skips it)

TIMEOUT = 0.5  # --grammar-compile-timeout; HOSTNAME_LIKE takes about 1.6 s to compile
ANSWER_WITHIN = TIMEOUT + 5.0  # seconds: the bound, the engine's poll and HTTP on 2 busy cores


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> str:
    """A 2-layer random llama (about 6 M parameters) with SmolLM2's vocabulary size."""
    import torch
    import transformers as tf
    from model_helpers import TINY

    torch.manual_seed(0)
    config = tf.LlamaConfig(**{**TINY, "vocab_size": 49152}, tie_word_embeddings=True)
    path = tmp_path_factory.mktemp("tiny-llama-smollm2-vocab")
    tf.LlamaForCausalLM(config).save_pretrained(path)
    return str(path)


@pytest.fixture(scope="module")
def server(model_dir):
    from cadence.loader.model_path import resolve_model_path

    srv = Server(
        [
            model_dir,
            "--tokenizer",
            resolve_model_path(None),
            "--grammar-compile-timeout",
            str(TIMEOUT),
            "--grammar-compile-threads",
            "1",  # the one thread gets stuck: the next compile needs its replacement
            "--num-gpu-blocks-override",
            "512",
            "--max-model-len",
            "512",
        ]
    )
    try:
        srv.wait_ready()
        # The first constrained request builds the vocabulary: seconds, not counted in the
        # compile bound, and not to be counted in the tests' answer times either.
        warm = complete(srv, {"regex": "[0-9]{2}"}, timeout=60)
        assert warm.status_code == 200, warm.text
        yield srv
    finally:
        srv.stop()


def complete(server: Server, structured: dict, timeout: float) -> httpx.Response:
    body = {"prompt": [1, 2, 3], "max_tokens": 24, "structured_outputs": structured}
    return httpx.post(server.url + "/v1/completions", json=body, timeout=timeout)


def test_a_slow_grammar_gets_a_400_naming_the_timeout_and_others_still_compile(server):
    t0 = time.monotonic()
    slow = complete(server, {"json": HOSTNAME_LIKE}, timeout=ANSWER_WITHIN + 5)
    elapsed = time.monotonic() - t0
    assert slow.status_code == 400, slow.text
    error = slow.json()["error"]
    assert error["type"] == "invalid_request_error"
    assert f"did not compile within {TIMEOUT:g} s" in error["message"]
    assert "--grammar-compile-timeout" in error["message"]
    assert TIMEOUT <= elapsed < ANSWER_WITHIN

    # Sent right after, while the abandoned compile still runs: a new grammar compiles.
    t0 = time.monotonic()
    ok = complete(server, {"choice": ["yes", "no"]}, timeout=30)
    assert ok.status_code == 200, ok.text
    choice = ok.json()["choices"][0]
    assert (choice["text"], choice["finish_reason"]) in (("yes", "stop"), ("no", "stop"))
    assert time.monotonic() - t0 < ANSWER_WITHIN
    assert httpx.get(server.url + "/health", timeout=5).status_code == 200

    # The same slow grammar again is refused at once: no second thread is tied up.
    t0 = time.monotonic()
    again = complete(server, {"json": HOSTNAME_LIKE}, timeout=30)
    assert again.status_code == 400
    assert "an earlier compile of this grammar" in again.json()["error"]["message"]
    assert time.monotonic() - t0 < TIMEOUT


def test_a_slow_regex_is_bounded_too(server):
    t0 = time.monotonic()
    # Any character, up to 2000 times: 1.7 to 3.4 s to compile.
    slow = complete(server, {"regex": ".{1,2000}"}, timeout=ANSWER_WITHIN + 5)
    assert slow.status_code == 400, slow.text
    assert "--grammar-compile-timeout" in slow.json()["error"]["message"]
    assert time.monotonic() - t0 < ANSWER_WITHIN
