"""Private working directories (cadence/private_dirs.py): named after their maker, mode
0700, and the next one made sweeps those whose maker is gone, while an attacker's links,
other users' directories, live makers (here or in another pid namespace) and names of
another form are left alone."""

from __future__ import annotations

import os
import re
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from cadence import private_dirs
from cadence.private_dirs import make_private_dir, name_pattern, pid_namespace

pytestmark = pytest.mark.skipif(not pid_namespace(), reason="needs Linux's /proc/self/ns/pid")

PREFIX = "cadence-test-"


@pytest.fixture
def short_dir():
    """A directory of a short path (a socket's path must fit in 108 bytes; pytest's own
    tmp_path under xdist does not leave room)."""
    path = tempfile.mkdtemp(prefix="pd-")
    yield Path(path)
    shutil.rmtree(path, ignore_errors=True)


def gone_pid() -> int:
    """The pid of a process that has exited (and been reaped)."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def left_behind(parent, pid: int, namespace: int | None = None, suffix="abcd_123") -> str:
    """A directory as a killed maker leaves it: named after it, mode 0700, a file inside."""
    path = os.path.join(parent, f"{PREFIX}{namespace or pid_namespace()}.{pid}-{suffix}")
    os.mkdir(path, 0o700)
    with open(os.path.join(path, "in"), "w") as f:
        f.write("x")
    return path


def test_a_new_directory_is_private_and_named_after_its_maker(short_dir):
    path = make_private_dir(PREFIX, str(short_dir))
    name = os.path.basename(path)
    match = re.fullmatch(name_pattern(PREFIX), name)
    assert match and match.groups() == (str(pid_namespace()), str(os.getpid()))
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o700


def test_the_next_directory_sweeps_those_of_gone_makers(short_dir):
    stale = [left_behind(short_dir, gone_pid(), suffix=f"stale{i:03d}") for i in range(2)]
    mine = make_private_dir(PREFIX, str(short_dir))  # (this process's own: kept)
    live = left_behind(short_dir, os.getppid(), suffix="livemakr")
    fresh = make_private_dir(PREFIX, str(short_dir))
    assert not any(os.path.exists(p) for p in stale)
    assert all(os.path.isdir(p) for p in (mine, live, fresh))


def test_a_killed_makers_directory_goes(short_dir):
    code = (
        "import os, sys; from cadence.private_dirs import make_private_dir; "
        f"print(make_private_dir({PREFIX!r}, {str(short_dir)!r}), flush=True); os.kill(os.getpid(), 9)"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    path = proc.stdout.strip()
    assert proc.returncode == -9 and os.path.isdir(path)
    make_private_dir(PREFIX, str(short_dir))
    assert not os.path.exists(path)


def test_what_is_not_a_stale_directory_stays(short_dir, monkeypatch):
    dead = gone_pid()
    other_namespace = left_behind(short_dir, dead, namespace=pid_namespace() + 1, suffix="otherns_")
    other_prefix = os.path.join(short_dir, f"cadence-other-{pid_namespace()}.{dead}-abcdefgh")
    os.mkdir(other_prefix, 0o700)
    unnamed = os.path.join(short_dir, f"{PREFIX}abcdefgh")  # (the form before pids in names)
    os.mkdir(unnamed, 0o700)
    shared = left_behind(short_dir, dead, suffix="shared__")
    os.chmod(shared, 0o755)  # (not one make_private_dir made)
    # A maker in another pid namespace sharing the filesystem: its socket still listens.
    listening = left_behind(short_dir, dead, suffix="listens_")
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(os.path.join(listening, "out"))
    server.listen(1)
    try:
        assert private_dirs.sweep_stale_dirs(PREFIX, str(short_dir)) == []
    finally:
        server.close()
    for path in (other_namespace, other_prefix, unnamed, shared, listening):
        assert os.path.isdir(path)
    # A socket nobody listens on any more (a killed maker's) does not keep it.
    assert private_dirs.sweep_stale_dirs(PREFIX, str(short_dir)) == [listening]
    # Another user's directory of the right form (seen from a uid that is not its owner).
    theirs = left_behind(short_dir, dead, suffix="theirs__")
    monkeypatch.setattr(private_dirs.os, "getuid", lambda: os.stat(theirs).st_uid + 1)
    assert private_dirs.sweep_stale_dirs(PREFIX, str(short_dir)) == []


def test_names_no_process_can_have_stop_nothing(short_dir):
    """Another user's directory of a pid beyond any pid_max (os.kill would overflow), and
    one of ours: the sweep skips both and the new directory is made."""
    huge = os.path.join(short_dir, f"{PREFIX}{pid_namespace()}.4194304-abcdefgh")
    os.mkdir(huge, 0o700)
    longer = os.path.join(short_dir, f"{PREFIX}{pid_namespace()}.9999999999-abcdefgh")
    os.mkdir(longer, 0o700)
    assert private_dirs.sweep_stale_dirs(PREFIX, str(short_dir)) == []
    assert os.path.isdir(make_private_dir(PREFIX, str(short_dir)))
    assert os.path.isdir(huge) and os.path.isdir(longer)


def test_an_attackers_links_lead_nowhere(short_dir):
    """A link named like a stale directory, and a stale directory holding a link: the sweep
    removes neither the links' targets nor anything in them."""
    victim = short_dir / "victim"
    victim.mkdir()
    (victim / "keep").write_text("precious")
    dead = gone_pid()
    link = os.path.join(short_dir, f"{PREFIX}{pid_namespace()}.{dead}-linkdir_")
    os.symlink(victim, link)
    stale = left_behind(short_dir, dead, suffix="haslink_")
    os.symlink(victim, os.path.join(stale, "inner"))
    os.symlink(victim / "keep", os.path.join(stale, "file"))
    removed = private_dirs.sweep_stale_dirs(PREFIX, str(short_dir))
    assert removed == [stale] and not os.path.exists(stale)
    assert os.path.islink(link)
    assert (victim / "keep").read_text() == "precious"
