"""A CPU engine's thread pool: one intra-op thread per core it owns, each pinned to its
core; run in a child process, since pinning changes the calling thread for good."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from cadence.ops import cpu_ops

CHILD = r"""
import json, os, sys, torch
from cadence.worker.cpu_threads import setup_cpu_threads
threads = None if sys.argv[1] == "none" else int(sys.argv[1])
used = setup_cpu_threads(threads, bind=sys.argv[2] == "bind")
torch.randn(512, 512) @ torch.randn(512, 512)  # the pool runs once
masks = set()
for tid in os.listdir("/proc/self/task"):
    for line in open(f"/proc/self/task/{tid}/status"):
        if line.startswith("Cpus_allowed_list"):
            masks.add(line.split()[1])
print(json.dumps({"used": used, "threads": torch.get_num_threads(), "masks": sorted(masks)}))
"""


def _child(threads: str, bind: str) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", CHILD, threads, bind], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(cpu_ops.ops() is None, reason="the CPU kernels did not build here")
def test_pinned_pool_puts_one_thread_on_each_core():
    cores = sorted(os.sched_getaffinity(0))
    got = _child("none", "bind")
    assert got["threads"] == len(cores)
    assert got["used"] == cores
    for core in cores:  # each core has a thread pinned to it alone
        assert str(core) in got["masks"]


def test_unpinned_pool_takes_the_thread_count_and_keeps_the_mask():
    got = _child("1", "nobind")
    assert got["threads"] == 1 and got["used"] == []
    assert len(got["masks"]) == 1  # nothing was narrowed


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two cores to leave one")
def test_a_pool_smaller_than_the_mask_is_not_pinned_to_the_first_cores():
    """Two engines started with --cpu-threads 1 must not both sit on core 0."""
    got = _child("1", "bind")
    assert got["threads"] == 1 and got["used"] == []
    assert len(got["masks"]) == 1  # every thread keeps the whole mask
