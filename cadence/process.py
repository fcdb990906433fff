"""Child processes that never outlive their parent (the engine core, tensor-parallel
workers): the kernel kills them when the parent dies, even mid-step."""

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
