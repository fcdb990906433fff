"""Triton kernels tested on the CPU run under Triton's interpreter, in a child process:
TRITON_INTERPRET must be set before triton is imported, and this test process has
imported it already. A test file answers `--interpreter-cases` by printing one JSON line
of results; its module-scoped fixture calls `interpreter_report(__file__)` once."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

TESTS_DIR = os.path.dirname(os.path.abspath(__file__))


def interpreter_report(test_file: str, *args: str) -> dict:
    """Run `test_file --interpreter-cases [args]` under the interpreter; its JSON line,
    parsed."""
    env = dict(os.environ, TRITON_INTERPRET="1")
    # The child imports the test's helpers as this process does: from tests/ and its folder.
    paths = [TESTS_DIR, os.path.dirname(os.path.abspath(test_file)), env.get("PYTHONPATH", "")]
    env["PYTHONPATH"] = os.pathsep.join(paths)
    proc = subprocess.run(
        [sys.executable, os.path.abspath(test_file), "--interpreter-cases", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    if proc.returncode != 0:
        pytest.fail(f"interpreter child failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])
