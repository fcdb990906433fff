"""NCCL against the one-shot all-reduce (cadence/distributed/one_shot.py), per message size,
on the GPUs of one host: the latency of one all-reduce, measured as CUDA graphs of 100
back-to-back all-reduces replayed 20 times (what a captured decode step sees), and the
one-shot's result checked against NCCL's. Prints one line per size and the crossover.

    python benchmarks/all_reduce_sweep.py [--ranks 2] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import socket

import torch
import torch.multiprocessing as mp

SIZES_KIB = [4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 65536]
INNER, REPLAYS = 100, 20


def _time_graph(fn, x) -> float:
    """Microseconds per call of fn(x), captured INNER times in one graph."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            fn(x)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(INNER):
            fn(x)
    graph.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(REPLAYS):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1e3 / (REPLAYS * INNER)


def _rank(rank: int, size: int, port: int, out_path: str | None) -> None:
    import torch.distributed as dist

    from cadence.distributed.communication import all_reduce
    from cadence.distributed.parallel_state import enable_one_shot, get_tp, init_tensor_parallel

    device = torch.device("cuda", rank)
    torch.cuda.set_device(device)
    init_tensor_parallel(rank, size, device, f"tcp://127.0.0.1:{port}")
    enable_one_shot(max(SIZES_KIB) * 2**10, torch.bfloat16)
    one_shot = get_tp().one_shot
    rows = []
    for kib in SIZES_KIB:
        n = kib * 2**10 // 2
        x = torch.randn(n, device=device, dtype=torch.bfloat16) * (rank + 1)
        ref = x.clone()
        dist.all_reduce(ref)
        got = one_shot.all_reduce(x)
        err = (got.float() - ref.float()).abs().max().item()

        def nccl(t):
            dist.all_reduce(t)

        nccl_us = _time_graph(nccl, x.clone())
        one_us = _time_graph(one_shot.all_reduce, x)
        via_layer = _time_graph(all_reduce, x.clone())
        rows.append({"kib": kib, "nccl_us": nccl_us, "one_shot_us": one_us,
                     "dispatch_us": via_layer, "max_abs_diff": err})  # fmt: skip
        if rank == 0:
            print(f"{kib:6d} KiB  nccl {nccl_us:7.2f} us  one-shot {one_us:7.2f} us  "
                  f"ratio {nccl_us / one_us:5.2f}  |diff| {err:.3g}", flush=True)  # fmt: skip
    if rank == 0:
        faster = [r["kib"] for r in rows if r["one_shot_us"] < r["nccl_us"]]
        print(f"one-shot faster up to {max(faster) if faster else 0} KiB")
        if out_path:
            with open(out_path, "w") as f:
                json.dump(rows, f, indent=1)
    dist.destroy_process_group()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--json")
    args = ap.parse_args()
    os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(_rank, args=(args.ranks, port, args.json), nprocs=args.ranks)


if __name__ == "__main__":
    main()
