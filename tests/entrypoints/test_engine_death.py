"""If the engine core process dies, /health says 503 and in-flight requests end at once;
a moment later the server exits with a non-zero code."""

from __future__ import annotations

import json
import os
import signal
import threading
import time

import httpx
import pytest
from server_helper import Server

pytestmark = pytest.mark.slow  # starts servers of its own (make test-fast skips it)


def test_killing_the_engine_fails_in_flight_requests_and_health(tiny_model_dir):
    srv = Server(
        [tiny_model_dir("llama"), "--num-gpu-blocks-override", "256", "--max-model-len", "512"]
    )
    try:
        srv.wait_ready()
        url = srv.url
        body = {"prompt": [1, 2, 3], "max_tokens": 400, "ignore_eos": True, "stream": True}
        events: list[str] = []
        got_first = threading.Event()

        def stream():
            with httpx.stream("POST", url + "/v1/completions", json=body, timeout=30) as r:
                for line in r.iter_lines():
                    if line:
                        events.append(line)
                        got_first.set()

        plain: dict = {}

        def non_streaming():
            plain["r"] = httpx.post(
                url + "/v1/completions", json={**body, "stream": False}, timeout=30
            )

        threads = [threading.Thread(target=stream), threading.Thread(target=non_streaming)]
        for t in threads:
            t.start()
        assert got_first.wait(30)
        os.kill(srv.engine_pid(), signal.SIGKILL)
        t0 = time.monotonic()
        for t in threads:
            t.join(15)
        assert time.monotonic() - t0 < 5, "in-flight requests must end at once"
        assert events[-1] == "data: [DONE]"
        err = json.loads(events[-2][6:])["error"]
        assert "engine" in err["message"]
        assert plain["r"].status_code == 503 and "engine" in plain["r"].json()["error"]["message"]
        health = httpx.get(url + "/health")
        assert health.status_code == 503 and health.json()["error"]["message"]
        again = httpx.post(url + "/v1/completions", json={"prompt": [1, 2], "max_tokens": 2})
        assert again.status_code == 503
        # Then the server exits by itself, non-zero, for a supervisor to restart it.
        assert srv.proc.wait(15) != 0
    finally:
        srv.stop()
    assert srv.proc.returncode is not None
