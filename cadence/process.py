"""Child processes that never outlive their parent (the engine core, tensor-parallel
workers, API processes): the kernel kills them when the parent dies, even mid-step. And a
handle on a sibling process known by its pid (ProcessByPid)."""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import sys

logger = logging.getLogger(__name__)

PR_SET_PDEATHSIG = 1  # from <linux/prctl.h>


def die_with_parent(parent_pid: int) -> bool:
    """Ask the kernel to SIGKILL this process when its parent thread dies (Linux only).
    Returns False if the parent is already gone."""
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            if libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
                logger.warning("prctl(PR_SET_PDEATHSIG) failed: errno %d", ctypes.get_errno())
        except (OSError, AttributeError) as e:
            logger.warning("prctl(PR_SET_PDEATHSIG) unavailable: %s", e)
    return os.getppid() == parent_pid


class ProcessByPid:
    """A process this one did not start (an engine started by the supervisor of several API
    processes), with the part of multiprocessing.Process's interface the engine client
    uses. Watches a pidfd where Linux has one, so a recycled pid is never mistaken for it."""

    exitcode = None  # (not ours to reap: the code is the parent's to read)

    def __init__(self, pid: int) -> None:
        self.pid = pid
        try:
            self._fd: int | None = os.pidfd_open(pid)
        except (AttributeError, OSError):
            self._fd = None

    def is_alive(self) -> bool:
        if self._fd is not None:
            import select

            return not select.select([self._fd], [], [], 0)[0]  # readable once it exited
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            pass
        return True

    def join(self, timeout: float | None = None) -> None:
        import time

        deadline = None if timeout is None else time.monotonic() + timeout
        while self.is_alive() and (deadline is None or time.monotonic() < deadline):
            time.sleep(0.05)

    def kill(self) -> None:
        self._signal(signal.SIGKILL)

    def terminate(self) -> None:
        self._signal(signal.SIGTERM)

    def _signal(self, sig: int) -> None:
        try:
            if self._fd is not None:
                signal.pidfd_send_signal(self._fd, sig)
            else:
                os.kill(self.pid, sig)
        except (ProcessLookupError, OSError):
            pass
