"""The collectives over two gloo ranks (two processes of this host), with no model: what
each rank gets back from all_reduce, all_gather_last, broadcast_ and min_over_ranks, and
that one rank gets its input back untouched."""

from __future__ import annotations

import socket

import torch
import torch.multiprocessing as mp

from cadence.distributed import communication as comm


def _rank(rank: int, port: int, results) -> None:
    from cadence.distributed.parallel_state import destroy_tensor_parallel, init_tensor_parallel

    init_tensor_parallel(rank, 2, torch.device("cpu"), f"tcp://127.0.0.1:{port}")
    x = torch.full((2, 3), float(rank + 1))
    gathered = comm.all_gather_last(torch.full((2, 2), float(rank)))
    tokens = torch.tensor([7, 8, 9]) if rank == 0 else torch.zeros(3, dtype=torch.int64)
    results[rank] = {
        "sum": comm.all_reduce(x).tolist(),
        "gathered": gathered.tolist(),
        "broadcast": comm.broadcast_(tokens).tolist(),
        "min": comm.min_over_ranks(100 + rank),
    }
    destroy_tensor_parallel()


def test_collectives_over_two_gloo_ranks():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with mp.Manager() as manager:
        results = manager.dict()
        mp.spawn(_rank, args=(port, results), nprocs=2)
        results = dict(results)
    for rank in (0, 1):
        r = results[rank]
        assert r["sum"] == [[3.0] * 3] * 2
        assert r["gathered"] == [[0.0, 0.0, 1.0, 1.0]] * 2  # rank 0's columns, then rank 1's
        assert r["broadcast"] == [7, 8, 9]
        assert r["min"] == 100


def test_one_rank_is_the_identity():
    x = torch.randn(4)
    assert comm.all_reduce(x) is x
    assert comm.all_gather_last(x) is x
    assert comm.min_over_ranks(5) == 5
