"""`Server`: a real `cadence serve` subprocess on 127.0.0.1 and a free port, for tests."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time

import httpx

from cadence.entrypoints.listener import LISTEN_FD_ENV, bind_listener

API_KEY = "test-key-123"


def handover_socket() -> tuple[socket.socket, dict]:
    """A socket listening on 127.0.0.1 and a port the OS picks, and what a child process
    that should serve on it needs: Popen's `pass_fds` and the environment entry that names
    it (cadence/entrypoints/listener.py). Nothing else can take the port, so whatever
    answers there is that child. Close the socket after Popen."""
    sock = bind_listener("127.0.0.1", 0)
    return sock, {"pass_fds": (sock.fileno(),), "env": {LISTEN_FD_ENV: str(sock.fileno())}}


def children(pid: int) -> list[tuple[int, bytes]]:
    """(pid, command line) of each child process of `pid` (from /proc)."""
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmd = f.read()
        except OSError:
            continue
        if ppid == pid:
            out.append((int(entry), cmd))
    return out


WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))  # pytest-xdist's, or 1


def worker_threads() -> int:
    """The CPU threads each pytest-xdist worker may use: its share of the cores (an engine
    on every core, beside another worker's work, would contend). At most 2 without xdist."""
    return max(1, min(2, len(os.sched_getaffinity(0)) // WORKERS))


def engine_threads() -> list[str]:
    """`cadence serve` flags that keep a served engine to its worker's share of the cores."""
    return [] if WORKERS < 2 else ["--cpu-threads", str(worker_threads())]


class Server:
    def __init__(self, args: list[str], env: dict | None = None) -> None:
        if "--cpu-threads" not in args:
            args = [*args, *engine_threads()]
        self._args, self._env = args, {**os.environ, **(env or {})}
        self._start()

    def _start(self) -> None:
        sock, handover = handover_socket()
        self.port = sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        cmd = [sys.executable, "-m", "cadence.cli.main", "serve", "--port", str(self.port)]
        # CADENCE_TEST_SERVER_LOG=1 shows the server's log in the test output; otherwise it
        # goes to a temporary file whose end a failed start reports (a CI flake says why).
        show = os.environ.get("CADENCE_TEST_SERVER_LOG")
        self.log = None if show else tempfile.TemporaryFile()  # noqa: SIM115 (the server's life)
        with sock:
            self.proc = subprocess.Popen(
                [*cmd, *self._args],
                env={**self._env, **handover["env"]},
                pass_fds=handover["pass_fds"],
                stdout=self.log,
                stderr=subprocess.STDOUT,
            )

    def log_tail(self, lines: int = 40) -> str:
        """The last `lines` lines the server printed ("" when shown live)."""
        if self.log is None:
            return ""
        self.log.seek(0)
        return "\n".join(self.log.read().decode(errors="replace").splitlines()[-lines:])

    def wait_ready(self, timeout: float = 180.0) -> None:
        """Until /health answers 200 (the port is this server's alone: handover_socket)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                code, tail = self.proc.returncode, self.log_tail()
                raise RuntimeError(f"server exited with {code}; its log ends:\n{tail}")
            try:
                if httpx.get(self.url + "/health", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise TimeoutError(f"server did not become healthy; its log ends:\n{self.log_tail()}")

    def engine_pid(self) -> int:
        """The engine core process: the child of the server named cadence::engine."""
        for pid, cmd in children(self.proc.pid):
            if b"cadence::engine" in cmd:
                return pid
        raise LookupError("no engine process")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def metric(http, name: str) -> float:
    """The sum of a Prometheus metric over its label sets, from /metrics."""
    text = http.get("/metrics").text
    total = 0.0
    found = False
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            total += float(line.rsplit(" ", 1)[1])
            found = True
    assert found, name
    return total
