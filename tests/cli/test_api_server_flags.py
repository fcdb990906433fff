"""--api-server-count: a usage error where several API processes cannot keep a promise, and
a default from the hardware (one beside a CPU engine, whose threads want every core)."""

from __future__ import annotations

import pytest

from cadence.entrypoints.api_servers import default_api_server_count


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--api-server-count", "0"], "must be positive, got 0"),
        (["--api-server-count", "2", "--responses-store-size", "8"], "not with --api-server-count"),
    ],
)
def test_bad_combinations_are_usage_errors(argv, message, capsys):
    from cadence.cli.main import main

    with pytest.raises(SystemExit) as e:
        main(["serve", *argv])
    assert e.value.code == 2
    assert message in capsys.readouterr().err


def test_the_default_is_one_process_beside_a_cpu_engine(monkeypatch):
    assert default_api_server_count("cpu") == 1
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # no GPU visible: auto means the CPU
    assert default_api_server_count("auto") == 1


@pytest.mark.parametrize(
    "argv",
    [["--api-server-count", "1"], ["--api-server-count", "2"], ["--data-parallel-size", "2"]],
    ids=["one-process", "two-processes", "dp"],
)
def test_a_busy_port_is_one_line_and_exit_code_1_before_anything_loads(argv):
    """The address is bound first (entrypoints/listener.py): a taken port fails at once, the
    model never loads (a directory that is no model would fail later, and differently)."""
    import socket
    import subprocess
    import sys

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = str(busy.getsockname()[1])
        run = subprocess.run(
            [sys.executable, "-m", "cadence.cli.main", "serve", "/nonexistent-model", *argv,
             "--port", port, "--device", "cpu"],
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
    assert run.returncode == 1
    assert f"cannot listen on 127.0.0.1:{port}" in run.stderr and "Traceback" not in run.stderr
