"""A tensor-parallel rank that dies takes the engine down cleanly, never into a hang:
offline, the next call raises naming the rank; a server fails its requests and exits
non-zero (for a supervisor to restart it)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import httpx
import pytest
from server_helper import Server, children
from tp_helpers import save_tiny_with_tokenizer

pytestmark = pytest.mark.slow  # starts servers of its own (make test-fast skips it)


def test_offline_call_raises_after_a_rank_dies(tiny_model_dir):
    # In a child process: rank 0 would end its own process if it stayed blocked.
    script = textwrap.dedent(
        f"""
        import os, signal
        from cadence import LLM, SamplingParams
        llm = LLM({tiny_model_dir("llama")!r}, tensor_parallel_size=2, dtype="float32",
                  device="cpu", kv_cache_memory=2**24)
        p = SamplingParams(max_tokens=4, ignore_eos=True)
        llm.generate([{{"prompt_token_ids": [1, 2, 3]}}], p, use_tqdm=False)
        rank1 = llm.engine.runner.procs[0]
        os.kill(rank1.pid, signal.SIGKILL)
        rank1.wait()
        try:
            llm.generate([{{"prompt_token_ids": [1, 2, 3]}}], p, use_tqdm=False)
        except RuntimeError as e:
            print("RAISED", e, flush=True)
        llm.shutdown()
        """
    )
    proc = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120
    )
    assert "RAISED a tensor-parallel rank died: rank 1" in proc.stdout, proc.stderr[-2000:]
    assert "exited with code -9" in proc.stdout
    assert proc.returncode == 0


def test_server_fails_requests_and_exits_nonzero_when_a_rank_dies(tmp_path):
    path = save_tiny_with_tokenizer(str(tmp_path / "tiny"))
    srv = Server([path, "-tp", "2", "--device", "cpu", "--dtype", "float32"])
    try:
        srv.wait_ready()
        http = httpx.Client(base_url=srv.url, timeout=30)
        body = {"model": path, "prompt": "Hello", "max_tokens": 4}
        assert http.post("/v1/completions", json=body).status_code == 200
        engine = srv.engine_pid()
        ranks = [pid for pid, cmd in children(engine) if b"cadence::tp1" in cmd]
        assert len(ranks) == 1, children(engine)
        os.kill(ranks[0], signal.SIGKILL)
        deadline = time.monotonic() + 60
        while srv.proc.poll() is None and time.monotonic() < deadline:
            try:  # a request now gets an error, not a hang
                r = http.post("/v1/completions", json=body)
                assert r.status_code >= 500, r.text
            except httpx.HTTPError:
                pass  # the server is going down
            time.sleep(0.2)
        assert srv.proc.poll() is not None, "the server did not exit"
        assert srv.proc.returncode != 0
    finally:
        srv.stop()
