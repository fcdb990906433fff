"""ProcessByPid: an API process's watch on the engine its supervisor started."""

from __future__ import annotations

import subprocess
import sys

from cadence.process import ProcessByPid


def test_a_process_known_by_pid_is_seen_alive_then_gone_once_killed():
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        watch = ProcessByPid(child.pid)
        assert watch.is_alive()
        watch.kill()
        watch.join(10)
        # Gone, even before its parent reaped it (a zombie is not alive).
        assert not watch.is_alive()
    finally:
        child.kill()
        child.wait()
