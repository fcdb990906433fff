"""Running a test module's `check_all("cpu")` under Triton's interpreter, in a child process:
TRITON_INTERPRET is read when triton is imported, and this process may have imported it
already."""

from __future__ import annotations

import os
import subprocess
import sys


def check_all_under_interpreter(module: str) -> None:
    """Import tests/ops/<module>.py in a child with TRITON_INTERPRET=1 and run its
    check_all("cpu"); fail with the child's stderr."""
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    here = os.path.dirname(__file__)
    code = f"import sys; sys.path.insert(0, {here!r}); import {module}; {module}.check_all('cpu')"
    proc = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
