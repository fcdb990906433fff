"""`cadence serve -dp N` starting its replicas (cadence/cli/data_parallel.py): a replica that
cannot start leaves none of the others running, and the server says why instead of a
traceback. (Serving through the replicas: tests/router/test_data_parallel.py.)"""

from __future__ import annotations

import argparse
import subprocess

import pytest

from cadence.cli import data_parallel


class StartedReplica:
    """A replica process that started and runs until signalled."""

    def __init__(self) -> None:
        self.signals: list[int] = []

    def poll(self):
        return 0 if self.signals else None

    def send_signal(self, sig: int) -> None:
        self.signals.append(sig)

    def wait(self, timeout=None) -> int:
        return 0


def failing_on_second_start(started: list):
    def popen(*args, **kwargs):
        if started:
            raise OSError("fork: out of resources")
        started.append(StartedReplica())
        return started[-1]

    return popen


def test_a_replica_that_cannot_start_stops_those_already_started(monkeypatch):
    started: list[StartedReplica] = []
    monkeypatch.setattr(subprocess, "Popen", failing_on_second_start(started))
    with pytest.raises(OSError):
        data_parallel.start_replicas(["model"], 2, "cpu", 1)
    assert len(started) == 1 and started[0].signals, "the first replica was stopped"


def test_the_dp_server_reports_a_failed_start_and_exits_1(monkeypatch, caplog):
    started: list[StartedReplica] = []
    monkeypatch.setattr(subprocess, "Popen", failing_on_second_start(started))
    args = argparse.Namespace(argv=["serve", "model"], data_parallel_size=2, shutdown_timeout=1)
    with caplog.at_level("ERROR"):
        assert data_parallel.run_data_parallel(args, {"device": "cpu"}, []) == 1
    assert "start-up failed: fork: out of resources" in caplog.text
    assert started[0].signals
