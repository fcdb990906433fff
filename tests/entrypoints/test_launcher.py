"""run_app (the routers' server): SIGTERM stops it and returns to the caller, whose cleanup
then runs (`serve -dp` stops and drains its replicas there). uvicorn.run would re-raise the
signal once stopped and end the process first."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import httpx

CHILD = """
from cadence.entrypoints.launcher import run_app
from cadence.entrypoints.listener import bind_listener

async def app(scope, receive, send):
    if scope["type"] == "lifespan":
        while (await receive())["type"] != "lifespan.shutdown":
            await send({"type": "lifespan.startup.complete"})
        await send({"type": "lifespan.shutdown.complete"})
        return
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"up"})

sock = bind_listener("127.0.0.1", 0)
print(sock.getsockname()[1], flush=True)
try:
    code = run_app(app, [sock])
finally:
    print("cleanup ran", flush=True)
print("run_app returned", code, flush=True)
"""


def test_sigterm_stops_the_app_and_the_callers_cleanup_runs():
    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        url = f"http://127.0.0.1:{int(proc.stdout.readline())}/"
        deadline = time.monotonic() + 60
        while True:  # (the socket listens from the start: a request waits until it serves)
            assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read()
            try:
                if httpx.get(url, timeout=5).text == "up":
                    break
            except httpx.HTTPError:
                pass
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err
    assert out.splitlines() == ["cleanup ran", "run_app returned 0"], (out, err)
