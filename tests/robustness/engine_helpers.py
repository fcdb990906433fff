"""Helpers for the engine-process tests: fault commands, process liveness, bounded waits."""

from __future__ import annotations

import os
import subprocess
import time

from server_helper import Server


def arm(path: os.PathLike | str, command: str) -> None:
    """Write a fault command for CADENCE_FAULT_FILE atomically (never read half-written)."""
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        f.write(command)
    os.replace(tmp, path)


def process_alive(pid: int) -> bool:
    """Running or sleeping; an exited process that nobody reaped yet (a zombie) is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")


def wait_gone(pid: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not process_alive(pid):
            return True
        time.sleep(0.1)
    return not process_alive(pid)


def wait_exit(srv: Server, timeout: float) -> int | None:
    """The server's exit code, or None if it is still running after `timeout` s."""
    try:
        return srv.proc.wait(timeout)
    except subprocess.TimeoutExpired:
        return None
