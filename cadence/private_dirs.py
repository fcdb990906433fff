"""Private working directories (ipc:// sockets, a rendezvous file, staged K/V) that a
process makes and removes when it stops, and that a process killed with SIGKILL (or by the
OOM killer) leaves behind: in /tmp, and in /dev/shm where the files hold memory.

    make_private_dir(prefix, parent)   "<parent>/<prefix><pid namespace>.<pid>-<8 random>",
                                       mode 0700; first sweeps the directories of that
                                       prefix whose maker is gone

Whose maker is gone: the name's pid namespace is this process's own and no process has
its pid, and no socket in it has a listener (a process in another namespace that shares
the directory's filesystem). Only directories of this user, not links, mode 0700 are
touched; the removal does not follow links inside them.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import re
import shutil
import socket
import stat
import tempfile

logger = logging.getLogger(__name__)

# mkdtemp's 8 random characters
_SUFFIX = r"[a-z0-9_]{8}"
MAX_PID = 1 << 22  # Linux's largest pid_max


def pid_namespace() -> int:
    """This process's pid namespace (its inode; 0 where /proc does not say)."""
    with contextlib.suppress(OSError, ValueError):
        link = os.readlink("/proc/self/ns/pid")  # "pid:[4026531836]"
        return int(link[link.index("[") + 1 : link.index("]")])
    return 0


def name_pattern(prefix: str) -> str:
    """A regular expression of the names make_private_dir gives (groups: namespace, pid)."""
    return re.escape(prefix) + r"([0-9]{1,12})\.([0-9]{1,7})-" + _SUFFIX


def make_private_dir(prefix: str, parent: str | None = None) -> str:
    """A new directory only this user can open, named after this process (module
    docstring), once the stale ones of `prefix` in `parent` (the temp dir) are removed."""
    parent = parent or tempfile.gettempdir()
    try:
        sweep_stale_dirs(prefix, parent)
    except Exception as e:  # (housekeeping: never what stops a server from starting)
        logger.warning("could not sweep stale directories in %s: %s", parent, e)
    return tempfile.mkdtemp(prefix=f"{prefix}{pid_namespace()}.{os.getpid()}-", dir=parent)


def sweep_stale_dirs(prefix: str, parent: str) -> list[str]:
    """Remove the directories of `prefix` in `parent` whose maker is gone; their paths."""
    namespace = pid_namespace()
    if not namespace:  # (without a namespace to compare, no pid can be judged)
        return []
    pattern = re.compile(name_pattern(prefix))
    removed = []
    for entry in os.scandir(parent):
        match = pattern.fullmatch(entry.name)
        if match is None or int(match.group(1)) != namespace:
            continue
        # (ownership first: anything below reads what only this user could have made)
        if not _private(entry.path):
            continue
        pid = int(match.group(2))
        if pid == os.getpid() or _alive(pid) or _has_listener(entry.path):
            continue
        shutil.rmtree(entry.path, ignore_errors=True)  # (links inside are unlinked, not followed)
        removed.append(entry.path)
    if removed:
        logger.info(
            "removed %d directories left in %s by processes that are gone", len(removed), parent
        )
    return removed


def _alive(pid: int) -> bool:
    """Whether a process has the pid (an impossible pid counts as alive: left alone)."""
    if not 0 < pid < MAX_PID:
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # (PermissionError: another user's process has the pid now)
        return True
    return True


def _private(path: str) -> bool:
    """A real directory (not a link) of this user that no one else can open."""
    try:
        st = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid() and not st.st_mode & 0o077


def _has_listener(path: str) -> bool:
    """Whether a socket in the directory accepts connections (its maker lives elsewhere)."""
    with contextlib.suppress(OSError):
        for entry in os.scandir(path):
            if not stat.S_ISSOCK(entry.stat(follow_symlinks=False).st_mode):
                continue
            probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            probe.settimeout(0.5)
            try:
                probe.connect(entry.path)
                return True
            except OSError as e:  # refused: a bound socket of a gone process
                if e.errno not in (errno.ECONNREFUSED, errno.ENOENT):
                    return True  # (a busy listener's full backlog, a timeout: alive)
            finally:
                probe.close()
    return False
