"""`router(urls, policy)`: a `cadence router` subprocess on a free port, for tests."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time

import httpx
from server_helper import handover_socket

# The deployment secret of the disaggregated tests (engines and router get it from the
# environment, as a deployment should give it: not on a command line).
KV_SECRET = "tests-kv-transfer-secret-0123456789"
KV_ENV = {"CADENCE_KV_TRANSFER_SECRET": KV_SECRET}


@contextlib.contextmanager
def router(urls: list[str], policy: str, prefill: list[str] = (), args: list[str] = ()):
    sock, handover = handover_socket()
    port = sock.getsockname()[1]
    cmd = [sys.executable, "-m", "cadence.cli.main", "router", "--port", str(port)]
    cmd += [arg for u in urls for arg in ("--worker", u)] + ["--policy", policy]
    cmd += [arg for u in prefill for arg in ("--prefill", u)] + list(args)
    log = None if os.environ.get("CADENCE_TEST_SERVER_LOG") else subprocess.DEVNULL
    env = {**os.environ, **KV_ENV, **handover["env"]}
    with sock:
        proc = subprocess.Popen(cmd, stdout=log, stderr=log, env=env, pass_fds=handover["pass_fds"])
    url = f"http://127.0.0.1:{port}"
    try:
        # Up to 30 s for /health to say 200 (a test may go on with workers that never
        # will); the socket listens from the start, so a poll waits rather than fails.
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"the router exited with {proc.returncode}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(url + "/health", timeout=1).status_code == 200:
                    break
            time.sleep(0.1)
        yield url
    finally:
        proc.terminate()
        proc.wait(30)
