"""`router(urls, policy)`: a `cadence router` subprocess on a free port, for tests."""

from __future__ import annotations

import contextlib
import subprocess
import sys
import time

import httpx
from server_helper import free_port


@contextlib.contextmanager
def router(urls: list[str], policy: str, prefill: list[str] = ()):
    port = free_port()
    cmd = [sys.executable, "-m", "cadence.cli.main", "router", "--port", str(port)]
    cmd += [arg for u in urls for arg in ("--worker", u)] + ["--policy", policy]
    cmd += [arg for u in prefill for arg in ("--prefill", u)]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(300):
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(url + "/health", timeout=1).status_code == 200:
                    break
            time.sleep(0.1)
        yield url
    finally:
        proc.terminate()
        proc.wait(30)
