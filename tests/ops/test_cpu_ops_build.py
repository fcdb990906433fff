"""Where and how the CPU kernels are built: one build, found by every way of starting the
engine (two paths to one venv never rebuild each other's module), and a build lock that a
killed build cannot leave behind."""

from __future__ import annotations

import fcntl
import subprocess
import sys
import textwrap

import pytest
import torch

from cadence.ops import cpu_ops


def test_a_finished_build_is_found_whatever_path_reached_torch(monkeypatch):
    """The build folder depends on what is built, not on the paths it was reached by (a
    symlinked venv, another checkout of the same sources): every way of starting the engine
    finds the one build, and imports it without torch's path-sensitive rebuild check."""
    here = cpu_ops.build_dir()
    monkeypatch.setattr(torch, "__file__", "/elsewhere/site-packages/torch/__init__.py")
    assert cpu_ops.build_dir() == here
    if cpu_ops.ops() is None:
        pytest.skip("the CPU kernels did not build here (no C++ compiler)")
    assert cpu_ops._import_built(here) is not None


def test_a_library_that_does_not_load_is_built_again(tmp_path):
    (tmp_path / f"{cpu_ops.MODULE}.so").write_bytes(b"half a library")  # a killed link
    assert cpu_ops._import_built(tmp_path) is None


def test_a_lock_left_by_a_killed_build_is_removed(tmp_path):
    (tmp_path / cpu_ops.TORCH_BATON).touch()  # what torch's build leaves when killed
    with cpu_ops.build_lock(tmp_path):
        assert not (tmp_path / cpu_ops.TORCH_BATON).exists()


def test_the_build_lock_is_exclusive_and_dies_with_its_holder(tmp_path):
    """A process holding the lock (a build in progress) keeps another from taking it, and
    the lock is free the moment that process is killed, with nothing to clean up."""
    holder = textwrap.dedent(
        f"""
        import sys
        from pathlib import Path
        from cadence.ops import cpu_ops
        with cpu_ops.build_lock(Path({str(tmp_path)!r})):
            print("held", flush=True)
            sys.stdin.read()  # until killed
        """
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", holder], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout.readline().strip() == "held"
        with open(tmp_path / "build.flock", "w") as handle, pytest.raises(BlockingIOError):
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)  # taken: a builder would wait
        proc.kill()
        proc.wait(timeout=30)
        (tmp_path / cpu_ops.TORCH_BATON).touch()  # the killed build's leftover
        with cpu_ops.build_lock(tmp_path):  # free at once, and the leftover is gone
            assert not (tmp_path / cpu_ops.TORCH_BATON).exists()
    finally:
        proc.kill()
