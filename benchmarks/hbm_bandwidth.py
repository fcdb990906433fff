"""HBM bandwidth of this GPU, measured: the denominator of the decode roofline.

    python benchmarks/hbm_bandwidth.py [--gib 4]

Times a device-to-device copy of a buffer much larger than L2 with CUDA events (median of
20) and counts read + written bytes. Prints GB/s (10^9 bytes) and, for Llama-3.1-8B's
15.0 GB of weights read per decode step, the fastest possible batch-1 step.
"""

from __future__ import annotations

import argparse
import json

import torch


def measure(gib: float = 4.0, iters: int = 20) -> float:
    n = int(gib * 2**30) // 2
    src = torch.empty(n, dtype=torch.bfloat16, device="cuda").normal_()
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    times = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        dst.copy_(src)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    times.sort()
    return 2 * src.numel() * src.element_size() / times[len(times) // 2] / 1e9


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gib", type=float, default=4.0)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    gbps = measure(args.gib)
    weights_gb = 15.0
    print(f"HBM copy bandwidth: {gbps:.0f} GB/s (read + write, {args.gib} GiB buffer)")
    print(
        f"batch-1 decode floor for {weights_gb} GB of weights: {weights_gb / gbps * 1e3:.2f} ms/step"
    )
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"hbm_gbps": gbps}, f)


if __name__ == "__main__":
    main()
