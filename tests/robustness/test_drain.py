"""SIGTERM drains (issue 14, point 12): new requests get 503 + Retry-After, running ones
finish within --shutdown-timeout, what is left is aborted with finish_reason "abort", and
the server exits 0 with no process left behind."""

from __future__ import annotations

import json
import signal
import threading
import time

import httpx
import pytest
from server_helper import Server

pytestmark = pytest.mark.slow  # starts servers of its own (make test-fast skips it)

ARGS = ["--num-gpu-blocks-override", "256", "--max-model-len", "512"]


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:  # a zombie is gone for our purpose
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _wait_gone(pid: int, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    return not _alive(pid)


class _Stream(threading.Thread):
    """A streamed completion read on a thread; `started` once its first event arrived."""

    def __init__(self, url: str, body: dict) -> None:
        super().__init__()
        self.url, self.body = url, body
        self.events: list[str] = []
        self.started = threading.Event()

    def run(self) -> None:
        with httpx.stream("POST", self.url, json=self.body, timeout=60) as r:
            for line in r.iter_lines():
                if line:
                    self.events.append(line)
                    self.started.set()

    def finish_reason(self) -> str | None:
        assert self.events[-1] == "data: [DONE]"
        return json.loads(self.events[-2][6:])["choices"][0]["finish_reason"]


def _late_request_gets_503(srv: Server) -> None:
    late = httpx.post(srv.url + "/v1/completions", json={"prompt": [1], "max_tokens": 1})
    assert late.status_code == 503, late.text
    assert late.headers["Retry-After"] and late.json()["error"]["type"]
    assert httpx.get(srv.url + "/health").status_code == 503


def test_sigterm_lets_running_requests_finish_then_exits_0(tiny_model_dir):
    srv = Server([tiny_model_dir("llama"), *ARGS, "--shutdown-timeout", "120"])
    try:
        srv.wait_ready()
        engine = srv.engine_pid()
        body = {"prompt": [5, 6], "max_tokens": 200, "ignore_eos": True, "stream": True}
        stream = _Stream(srv.url + "/v1/completions", body)
        stream.start()
        assert stream.started.wait(30)
        srv.proc.send_signal(signal.SIGTERM)
        if stream.is_alive():
            _late_request_gets_503(srv)
        stream.join(60)
        assert stream.finish_reason() == "length"
        assert srv.proc.wait(30) == 0  # at once when idle, not after the 120 s grace
        assert _wait_gone(engine, 10), "the engine process outlived the server"
    finally:
        srv.stop()


def test_sigterm_aborts_what_outlives_the_grace(tiny_model_dir, tmp_path):
    fault = tmp_path / "fault"
    srv = Server(
        [tiny_model_dir("llama"), *ARGS, "--shutdown-timeout", "0.5"],
        env={"CADENCE_FAULT_FILE": str(fault)},
    )
    try:
        srv.wait_ready()
        engine = srv.engine_pid()
        body = {"prompt": [1, 2, 3], "max_tokens": 400, "ignore_eos": True, "stream": True}
        stream = _Stream(srv.url + "/v1/completions", body)
        stream.start()
        assert stream.started.wait(30)
        fault.write_text("hang 5")  # the engine stalls: the stream cannot finish in 0.5 s
        t0 = time.monotonic()
        srv.proc.send_signal(signal.SIGTERM)
        _late_request_gets_503(srv)
        stream.join(30)
        assert stream.finish_reason() == "abort"
        assert time.monotonic() - t0 < 5
        assert srv.proc.wait(30) == 0
        assert _wait_gone(engine, 15), "the engine process outlived the server"
    finally:
        srv.stop()


def test_sigterm_when_idle_exits_0_at_once(tiny_model_dir):
    srv = Server([tiny_model_dir("llama"), *ARGS])
    try:
        srv.wait_ready()
        t0 = time.monotonic()
        srv.proc.send_signal(signal.SIGTERM)
        assert srv.proc.wait(20) == 0
        assert time.monotonic() - t0 < 10
    finally:
        srv.stop()
