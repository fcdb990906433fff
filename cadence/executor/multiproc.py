"""Ranks 1..N-1 as processes of this host, one per GPU (or per CPU share, with gloo).

Each is `python -m cadence.executor.worker`, its WorkerSpec as JSON on stdin: a plain
child process rather than a multiprocessing one, because the engine core that starts it
is itself a daemonic multiprocessing child, which may not have such children. The kernel
kills a rank when the process that started it dies (PR_SET_PDEATHSIG), and a rank also
exits when it finds its parent gone.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import threading

import torch

from cadence.executor.distributed import DistributedExecutor
from cadence.executor.worker import WorkerSpec, encode_spec

logger = logging.getLogger(__name__)

STOP_TIMEOUT_S = 10.0


class MultiprocExecutor(DistributedExecutor):
    def _prepare(self) -> str:
        return "127.0.0.1"

    def _driver_device(self) -> torch.device:
        return torch.device("cuda:0") if self.device_type == "cuda" else torch.device("cpu")

    def _worker_device(self, rank: int) -> str:
        if self.device_type != "cuda":
            return "cpu"
        if torch.cuda.device_count() < self.size:
            raise ValueError(
                f"tensor_parallel_size {self.size} needs {self.size} GPUs on this host; "
                f"{torch.cuda.device_count()} visible"
            )
        return f"cuda:{rank}"

    def _launch(self, specs: list[WorkerSpec]) -> None:
        self.procs: list[subprocess.Popen] = []
        self._exits = threading.Condition()
        for spec in specs:
            spec.parent_pid = os.getpid()
            proc = subprocess.Popen(
                [sys.executable, "-m", "cadence.executor.worker"], stdin=subprocess.PIPE
            )
            proc.stdin.write(encode_spec(spec))
            proc.stdin.close()
            self.procs.append(proc)
            threading.Thread(
                target=self._reap, args=(proc,), name=f"cadence-tp{spec.rank}-reaper", daemon=True
            ).start()

    def _reap(self, proc: subprocess.Popen) -> None:
        proc.wait()
        with self._exits:
            self._exits.notify_all()

    def _wait_for_death(self) -> str | None:
        with self._exits:
            while True:
                for rank, proc in enumerate(self.procs, start=1):
                    if proc.returncode is not None:
                        return (
                            None
                            if self._closed
                            else (
                                f"rank {rank} (pid {proc.pid}) exited with code {proc.returncode}"
                            )
                        )
                self._exits.wait()

    def _stop_ranks(self) -> None:
        # Ranks of a broken step may be blocked in a collective: no point waiting for them.
        timeout = 0.5 if (self._broken or self._dead) else STOP_TIMEOUT_S
        for proc in getattr(self, "procs", []):
            try:
                proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                logger.warning("rank process %d did not exit: killing it", proc.pid)
                proc.kill()
                proc.wait()
