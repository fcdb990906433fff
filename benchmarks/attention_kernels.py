"""Time one layer's paged attention: the Triton backend against the torch reference (CUDA).

    python benchmarks/attention_kernels.py [--heads 32 --kv-heads 8 --head-dim 128]

Each row times `backend.forward` (the K/V write plus attention) for one layer: `eager ms`
with `triton.testing.do_bench` (median; small cases are bound by Python launch overhead),
`graph ms` replaying a CUDA graph of the call (GPU time alone; Triton only). GB/s counts each request's context K and V once
(seq_len x kv heads x head_dim x 2 x bytes), the least any kernel must read; for the
prefill rows TFLOP/s (causal, 4 * heads * head_dim * L^2 / 2) is the better measure.
"""

from __future__ import annotations

import argparse

import torch

from cadence.attention.base import AttentionMetadata
from cadence.attention.torch_ref import TorchAttentionBackend
from cadence.attention.triton_paged import TritonAttentionBackend


def make_step(query_lens, seq_lens, args, device="cuda", spans=()):
    """`spans`: (request, lo, hi) positions that see each other both ways (key limits)."""
    bs, hkv, d = args.block_size, args.kv_heads, args.head_dim
    dtype = getattr(torch, args.dtype)
    blocks = [-(-s // bs) for s in seq_lens]
    num_blocks = 1 + sum(blocks)
    perm = torch.randperm(num_blocks - 1) + 1  # scattered blocks, as after some churn
    tables = torch.zeros(len(seq_lens), max(blocks), dtype=torch.int64)
    slots, used = [], 0
    for b, (n, q, s) in enumerate(zip(blocks, query_lens, seq_lens)):
        tables[b, :n] = perm[used : used + n]
        used += n
        pos = torch.arange(s - q, s)
        slots.append(tables[b, pos // bs] * bs + pos % bs)
    cache = torch.randn(2, num_blocks, bs, hkv, d, dtype=dtype, device=device)
    t = sum(query_lens)
    q = torch.randn(t, args.heads, d, dtype=dtype, device=device)
    k = torch.randn(t, hkv, d, dtype=dtype, device=device)
    v = torch.randn(t, hkv, d, dtype=dtype, device=device)
    qsl = torch.zeros(len(query_lens) + 1, dtype=torch.int64)
    qsl[1:] = torch.cumsum(torch.tensor(query_lens), 0)

    limits = torch.cat([torch.arange(s - q, s) for q, s in zip(query_lens, seq_lens)])
    for req, lo, hi in spans:
        first = int(qsl[req]) - (seq_lens[req] - query_lens[req])  # row of position 0
        limits[first + lo : first + hi] = hi - 1

    def meta():
        m = AttentionMetadata(
            num_tokens=t,
            query_start_loc=qsl.to(device),
            seq_lens=torch.tensor(seq_lens, device=device),
            slot_mapping=torch.cat(slots).to(device),
            block_tables=tables.to(device),
            query_lens_cpu=list(query_lens),
            seq_lens_cpu=list(seq_lens),
            block_size=bs,
        )
        if spans:
            m.key_limits_cpu, m.key_limits = limits, limits.to(device, torch.int32)
        return m

    return q, k, v, cache, meta


def time_backend(backend, step, scale, graph: bool) -> tuple[float, float | None]:
    from triton.testing import do_bench, do_bench_cudagraph

    q, k, v, cache, meta = step
    m = backend.build(meta())

    def fn():
        return backend.forward(q, k, v, cache, m, scale)

    eager = do_bench(fn, warmup=25, rep=200)
    replay = None
    if graph:
        fn()  # compile outside the capture
        torch.cuda.synchronize()
        replay = do_bench_cudagraph(fn, rep=100)
    return eager, replay


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--kv-heads", type=int, default=8)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--no-torch", action="store_true", help="skip the (slow) reference")
    args = ap.parse_args()
    elem = torch.finfo(getattr(torch, args.dtype)).bits // 8
    scale = args.head_dim**-0.5
    scenarios = [
        ("decode b=1 ctx=1k", [1], [1024]),
        ("decode b=1 ctx=4k", [1], [4096]),
        ("decode b=1 ctx=8k", [1], [8192]),
        ("decode b=4 ctx=2k", [1] * 4, [2048] * 4),
        ("decode b=16 ctx=2k", [1] * 16, [2048] * 16),
        ("decode b=64 ctx=1k", [1] * 64, [1024] * 64),
        ("decode b=64 ctx=4k", [1] * 64, [4096] * 64),
        ("prefill 2k", [2048], [2048]),
        ("prefill 512 on 3.5k prefix + 32 decodes@2k", [512] + [1] * 32, [4096] + [2048] * 32),
    ]
    # Gemma 3's images: four of 256 tokens seen both ways in the 2k prefill (key limits)
    images = [(0, lo, lo + 256) for lo in (100, 600, 1100, 1600)]
    scenarios = [(name, qlens, slens, ()) for name, qlens, slens in scenarios]
    scenarios.append(("prefill 2k, 4 images both ways", [2048], [2048], images))
    print(f"heads {args.heads}/{args.kv_heads}, head_dim {args.head_dim}, {args.dtype}, "
          f"block_size {args.block_size}")  # fmt: skip
    header = (
        f"{'scenario':44s} {'backend':14s} {'eager ms':>9s} {'graph ms':>9s} "
        f"{'GB/s':>7s} {'TFLOP/s':>8s}"
    )
    print(header)
    print("-" * len(header))
    for name, qlens, slens, spans in scenarios:
        torch.manual_seed(0)
        step = make_step(qlens, slens, args, spans=spans)
        kv_bytes = sum(slens) * args.kv_heads * args.head_dim * 2 * elem
        flops = sum(
            4 * args.heads * args.head_dim * q * (s - q + (q + 1) / 2) for q, s in zip(qlens, slens)
        )
        backends = [("triton", TritonAttentionBackend(num_kv_heads=args.kv_heads))]
        if all(q == 1 for q in qlens) and len(qlens) <= 16:
            backends.append(("triton nosplit", TritonAttentionBackend(split_kv=False)))
        if not args.no_torch:
            backends.append(("torch", TorchAttentionBackend()))
        for label, backend in backends:
            eager, replay = time_backend(backend, step, scale, graph=label != "torch")
            ms = replay or eager
            shown = f"{replay:9.3f}" if replay else f"{'-':>9s}"
            print(
                f"{name:44s} {label:14s} {eager:9.3f} {shown} {kv_bytes / ms / 1e6:7.0f} "
                f"{flops / ms / 1e9:8.1f}"
            )


if __name__ == "__main__":
    main()
