"""The profiler and the engine's request table, guarded: a server with --api-key (users)
and --admin-api-key (the operator), --profile-max-seconds 2, --profile-max-traces 2.

- Starting or stopping a profile needs the admin key (403 with the users' key, 401 with
  none); /v1/engine/requests shows request ids only to the admin key.
- A profile stops by itself after --profile-max-seconds, and its trace is written.
- Writing a trace happens off the engine thread: a stream keeps getting tokens while the
  stop call waits for its trace.
- At most --profile-max-traces traces stay in the folder.
"""

from __future__ import annotations

import gzip
import json
import os
import threading
import time

import httpx
import pytest
from model_helpers import make_prompts
from server_helper import API_KEY, Server

pytestmark = pytest.mark.slow  # starts servers of its own (make test-fast skips it)

ADMIN_KEY = "operator-key-456"
USER = {"Authorization": f"Bearer {API_KEY}"}
ADMIN = {"Authorization": f"Bearer {ADMIN_KEY}"}


@pytest.fixture(scope="module")
def srv(tiny_model_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("traces")
    server = Server(
        [
            tiny_model_dir("llama-long"),  # room for a stream that outlasts a stop call
            *("--device", "cpu", "--dtype", "float32", "--max-model-len", "4096"),
            *("--api-key", API_KEY, "--admin-api-key", ADMIN_KEY),
            *("--profile-dir", str(out), "--profile-max-seconds", "2", "--profile-max-traces", "2"),
        ]
    )
    try:
        server.wait_ready(300)
        yield server, out
    finally:
        server.stop()


def traces(folder) -> list[str]:
    """The traces written in full (one being written has a hidden name until renamed)."""
    return sorted(
        f for f in os.listdir(folder) if f.endswith(".pt.trace.json.gz") and not f.startswith(".")
    )


class Stream:
    """A long streamed completion in the background; the arrival time of each event.
    `close()` hangs up (the rest of a long stream is not waited for)."""

    def __init__(self, url: str, max_tokens: int = 400) -> None:
        self.times: list[float] = []
        self.closing = threading.Event()
        body = {"prompt": make_prompts(512, [8], seed=95)[0], "max_tokens": max_tokens}
        body.update(stream=True, ignore_eos=True)
        self.thread = threading.Thread(target=self._run, args=(url, body))
        self.thread.start()
        deadline = time.monotonic() + 60
        while not self.times:
            assert self.thread.is_alive() and time.monotonic() < deadline
            time.sleep(0.01)

    def _run(self, url: str, body: dict) -> None:
        with httpx.stream(
            "POST", url + "/v1/completions", json=body, headers=USER, timeout=120
        ) as r:
            for line in r.iter_lines():
                if line:
                    self.times.append(time.monotonic())
                if self.closing.is_set():
                    break

    def join(self) -> None:
        self.thread.join(120)

    def close(self) -> None:
        self.closing.set()
        self.join()


def test_the_profiler_and_other_users_ids_need_the_admin_key(srv):
    server, _ = srv
    with httpx.Client(base_url=server.url, timeout=60) as c:
        for path in ("/start_profile", "/stop_profile"):
            assert c.post(path).status_code == 401
            r = c.post(path, headers=USER)
            assert r.status_code == 403 and r.json()["error"]["code"] == "admin_only"
        stream = Stream(server.url, max_tokens=4000)  # still running when both ask
        user_rows = c.get("/v1/engine/requests", headers=USER).json()["requests"]
        admin_rows = c.get("/v1/engine/requests", headers=ADMIN).json()["requests"]
        stream.close()
    assert user_rows and all("id" not in row for row in user_rows)
    assert admin_rows and all(row["id"].startswith("cmpl-") for row in admin_rows)
    assert {"state", "prompt_tokens", "output_tokens"} <= set(user_rows[0])


def test_writing_the_trace_does_not_stop_the_engine(srv):
    server, folder = srv
    with httpx.Client(base_url=server.url, headers=ADMIN, timeout=120) as c:
        stream = Stream(server.url, max_tokens=4000)  # far longer than the stop call
        bad = c.post("/start_profile", json={"record_shapes": "yes"})
        assert bad.status_code == 400 and "record_shapes" in bad.json()["error"]["message"]
        assert c.post("/start_profile", json={"record_shapes": True}).json()["max_seconds"] == 2
        time.sleep(0.2)  # (record some steps: the trace's size, so its writing time, grows with it)
        t0 = time.monotonic()
        stopped = c.post("/stop_profile").json()
        t1 = time.monotonic()
        stream.close()
    # The stop call waited for the trace; the stream got tokens meanwhile.
    assert any(t0 < t < t1 for t in stream.times), (t1 - t0, len(stream.times))
    with gzip.open(stopped["trace"]) as f:
        assert any(e.get("name") == "cadence::step" for e in json.load(f)["traceEvents"])
    assert os.path.basename(stopped["trace"]) in traces(folder)


def test_a_forgotten_profile_stops_by_itself_and_old_traces_go(srv):
    server, folder = srv
    with httpx.Client(base_url=server.url, headers=ADMIN, timeout=120) as c:
        for _ in range(3):  # each left running: stopped after 2 s, written
            before = set(traces(folder))
            assert c.post("/start_profile").status_code == 200
            c.post("/v1/completions", json={"prompt": [1, 2, 3], "max_tokens": 4})
            deadline = time.monotonic() + 60
            while not set(traces(folder)) - before:
                assert time.monotonic() < deadline, "the profile never stopped"
                time.sleep(0.2)
            r = c.post("/stop_profile")
            assert r.status_code == 400 and "no profile" in r.json()["error"]["message"]
    # The writer prunes right after its rename: the oldest goes (bounded wait).
    deadline = time.monotonic() + 30
    while len(traces(folder)) != 2:
        assert time.monotonic() < deadline, traces(folder)
        time.sleep(0.2)
