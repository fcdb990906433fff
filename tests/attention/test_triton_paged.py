"""The Triton paged-attention backend against the torch reference.

CPU: the kernels run under Triton's interpreter, which reads TRITON_INTERPRET=1 when triton
is first imported. The pytest process may already have imported triton (another test, a
plugin), so the interpreter cases run in one child process started with the variable set:
the child runs this file as a script, computes every case and prints a JSON report, and the
parametrised tests below each check their case's entry.

GPU (`@pytest.mark.gpu`): real sizes with compiled kernels, in this process.

Every case fills the cache with NaN (block 0 zeroed, as the model runner does), writes the
cached prefixes directly, then lets the backend write the step's K/V: an unmasked read of
an unused slot would show up as NaN in the output.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from dataclasses import dataclass

import pytest
import torch
from interpreter_child import interpreter_report as run_interpreter_child

HAS_TRITON = importlib.util.find_spec("triton") is not None
needs_triton = pytest.mark.skipif(not HAS_TRITON, reason="triton is not installed")

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
# (atol, rtol) against the reference computed in float32 from the same inputs.
TOLERANCE = {"float32": (2e-5, 1e-4), "bfloat16": (3e-2, 3e-2), "float16": (5e-3, 5e-3)}


@dataclass(frozen=True)
class Case:
    name: str
    query_lens: tuple[int, ...]
    seq_lens: tuple[int, ...]
    num_heads: int = 4
    num_kv_heads: int = 2
    head_dim: int = 64
    block_size: int = 16
    dtype: str = "float32"
    split_kv: bool | None = False  # None: the backend's own heuristic
    split_min_partition: int = 32
    seed: int = 0
    rotary: bool = False  # the backend rotates q and k (kernel A) before attending
    # Every request a decode, run through the fixed plan a CUDA graph captures
    # (decode_plan; split-KV when split_kv is True) instead of build()'s.
    graph_plan: bool = False
    window: int | None = None  # a sliding-window layer's W
    softcap: float | None = None  # Gemma 2's score cap
    sinks: bool = False  # GPT-OSS's sink logit per head (random, seeded)
    # (request, lo, hi): positions [lo, hi) of a request see each other both ways (an image
    # of Gemma 3's): the step's key limits
    spans: tuple[tuple[int, int, int], ...] = ()
    # "rms" / "gemma": the backend norms each head of q and k (kernel A) before rotary, with
    # random weights, as the model's RMSNorm / GemmaRMSNorm modules would
    head_norm: str | None = None


def _random_mixed(seed: int, num_reqs: int, max_ctx: int, **kw) -> Case:
    """A mixed batch: chunk lengths 1..40 (about a third decodes), cached prefixes."""
    g = torch.Generator().manual_seed(seed)
    qlens, slens = [], []
    for _ in range(num_reqs):
        decode = torch.rand((), generator=g) < 0.35
        q = 1 if decode else int(torch.randint(1, 41, (), generator=g))
        ctx = int(torch.randint(0, max_ctx, (), generator=g))
        qlens.append(q)
        slens.append(ctx + q)
    return Case(f"random_{seed}", tuple(qlens), tuple(slens), seed=seed, **kw)


# Small on purpose: the interpreter runs every program one after another in numpy.
CPU_CASES = [
    Case("decode_only_g2", (1, 1, 1), (1, 37, 150)),
    Case("prefill_only_g1", (5, 40), (5, 40), num_heads=2, num_kv_heads=2),
    Case("mixed_cached_g4_bs32", (1, 17, 1, 33, 3), (200, 60, 9, 100, 3), 4, 1, block_size=32),
    Case("mixed_d128_g2", (2, 1, 24), (50, 129, 80), 4, 2, head_dim=128),
    Case("mixed_g3_unpadded_group", (1, 7, 1), (70, 20, 33), 3, 1),
    Case("bf16_mixed_g4_d128", (1, 9, 1), (90, 30, 140), 4, 1, 128, dtype="bfloat16"),
    Case("fp16_mixed_g2_bs32", (3, 1, 20), (40, 77, 20), block_size=32, dtype="float16"),
    _random_mixed(1, 6, 260, num_heads=4, num_kv_heads=1),
    _random_mixed(2, 5, 300, num_heads=2, num_kv_heads=1, block_size=32, dtype="bfloat16"),
    Case("tiny_blocks_bs4", (1, 6, 1), (30, 19, 5), block_size=4),
    Case("split_decode_g2", (1, 1, 1, 1), (1, 64, 300, 257), split_kv=True),
    Case(
        "split_mixed_g4_bf16", (1, 12, 1), (260, 40, 90), 4, 1, 128, dtype="bfloat16", split_kv=True
    ),
    Case("split_g1_bs8", (1, 1), (150, 33), 2, 2, block_size=8, split_kv=True),
    Case("split_heuristic_off_at_short_context", (1, 1), (100, 50), split_kv=None),
    Case("long_chunk_several_items_g2", (130, 1), (250, 300)),
    Case("g8_subtiles", (1, 40, 1), (64, 100, 200), 8, 1, block_size=32),
    Case("d32_g4_fp16", (1, 23, 1), (30, 60, 260), 8, 2, 32, dtype="float16"),
    Case("block_size_24_not_pow2", (1, 18, 1), (49, 70, 24), block_size=24),
    Case("rotary_mixed_g3", (1, 7, 1), (70, 20, 33), 6, 2, rotary=True),
    Case("rotary_bf16_d128", (1, 9, 1), (90, 30, 140), 4, 1, 128, dtype="bfloat16", rotary=True),
    _random_mixed(3, 8, 320, num_heads=4, num_kv_heads=2, block_size=32),
    _random_mixed(4, 8, 320, num_heads=8, num_kv_heads=2, head_dim=128, dtype="float16"),
    _random_mixed(5, 6, 300, num_heads=4, num_kv_heads=1, dtype="bfloat16", split_kv=True),
    # What a split-KV decode graph replays: one partition count for the batch size, each
    # context cut by its own length; seq_len 1 is a graph's padding row.
    Case("graph_split_varied_contexts", (1, 1, 1, 1), (1, 700, 33, 1500), split_kv=True,
         graph_plan=True),
    Case("graph_split_bf16_g4", (1, 1), (1030, 64), 4, 1, 128, dtype="bfloat16", split_kv=True,
         split_min_partition=256, graph_plan=True),
    Case("graph_plain_decodes", (1, 1, 1), (1, 300, 45), split_kv=False, graph_plan=True),
    # Layer options. A 40-token chunk at 260 with W = 100: its tiles start past the window,
    # some keys only its first rows see (masked), a middle every row sees, the causal tail.
    Case("window_mixed_g2", (1, 40, 1, 7), (300, 300, 90, 7), window=100),
    Case("window_shorter_than_chunk", (1, 70), (20, 200), 4, 1, window=24, block_size=8),
    Case("window_split_decodes", (1, 1, 1), (400, 30, 1000), window=130, split_kv=True),
    Case("window_graph_split_bf16", (1, 1), (700, 1), 4, 1, 128, dtype="bfloat16",
         window=200, split_kv=True, graph_plan=True),
    Case("softcap_mixed_bf16", (1, 33, 1), (150, 60, 9), 4, 2, dtype="bfloat16", softcap=2.0),
    Case("sinks_mixed_window", (1, 33, 1, 5), (150, 60, 9, 40), 8, 2, window=24, sinks=True),
    Case("sinks_split_decodes", (1, 1), (400, 30), 4, 2, split_kv=True, sinks=True),
    Case("softcap_window_split", (1, 1, 9), (300, 64, 9), window=50, softcap=3.0,
         split_kv=True),
    Case("head_dim_96_rotary", (1, 21, 1), (80, 50, 33), 6, 2, 96, rotary=True),
    # Per-head norms in kernel A (Qwen3's, Gemma 3's): with rotary and without.
    Case("head_norm_rotary_bf16_g8", (1, 9, 1), (90, 30, 140), 8, 1, 128, dtype="bfloat16",
         rotary=True, head_norm="rms"),
    Case("head_norm_gemma_fp16", (1, 5), (40, 20), 4, 2, dtype="float16", rotary=True,
         head_norm="gemma"),
    Case("head_norm_no_rotary_bf16", (3, 1), (3, 50), 4, 2, dtype="bfloat16", head_norm="rms"),
    Case("head_norm_d96_f32", (1, 6), (30, 6), 4, 2, 96, rotary=True, head_norm="rms"),
    Case("head_dim_80_split_bf16", (1, 1), (333, 90), 4, 1, 80, dtype="bfloat16",
         split_kv=True),
    # Key limits: a span inside a chunk, one begun in the cached prefix, one across a
    # long chunk's work items, one under a window shorter than itself.
    Case("limits_mixed_g2", (1, 40, 1, 20), (300, 60, 90, 20), spans=((1, 25, 45), (3, 3, 15))),
    Case("limits_from_cache_g4", (1, 12, 1), (90, 30, 140), 4, 1, spans=((1, 10, 26),)),
    Case("limits_long_chunk", (130, 1), (200, 50), spans=((0, 100, 190),)),
    Case("limits_window_bf16", (1, 30, 1), (50, 40, 30), 4, 1, 128, dtype="bfloat16",
         window=8, spans=((1, 12, 30),)),
]  # fmt: skip


def _make_batch(case: Case, device: str | torch.device):
    """Random q/k/v for the step, a NaN-filled cache holding each request's prefix, and
    the metadata the model runner would pass (slots of the step's tokens, block tables)."""
    from cadence.attention.base import AttentionMetadata

    gen = torch.Generator().manual_seed(case.seed)
    dtype = DTYPES[case.dtype]
    bs, hq, hkv, d = case.block_size, case.num_heads, case.num_kv_heads, case.head_dim
    blocks_per_req = [-(-s // bs) for s in case.seq_lens]
    num_blocks = 1 + sum(blocks_per_req) + 3  # block 0 reserved, a few never used
    perm = (torch.randperm(num_blocks - 1, generator=gen) + 1).tolist()
    max_blocks = max(blocks_per_req) + 1  # a spare column of zeros, like a padded table
    tables = torch.zeros(len(case.seq_lens), max_blocks, dtype=torch.int64)
    for b, n in enumerate(blocks_per_req):
        tables[b, :n] = torch.tensor(perm[:n])
        perm = perm[n:]

    cache = torch.full((2, num_blocks, bs, hkv, d), float("nan"), dtype=dtype)
    cache[:, 0] = 0
    slots = []
    for b, (qlen, slen) in enumerate(zip(case.query_lens, case.seq_lens)):
        pos = torch.arange(slen)
        s = tables[b, pos // bs] * bs + pos % bs
        ctx = slen - qlen
        flat = cache.view(2, -1, hkv, d)
        flat[:, s[:ctx]] = torch.randn(2, ctx, hkv, d, generator=gen).to(dtype)
        slots.append(s[ctx:])
    t = sum(case.query_lens)
    # q/k/v as strided views of one fused projection, as the model produces them.
    qkv = torch.randn(t, (hq + 2 * hkv) * d, generator=gen).to(dtype)
    q, k, v = qkv.split([hq * d, hkv * d, hkv * d], dim=-1)
    q, k, v = q.view(t, hq, d), k.view(t, hkv, d), v.view(t, hkv, d)

    qsl = torch.zeros(len(case.query_lens) + 1, dtype=torch.int64)
    qsl[1:] = torch.cumsum(torch.tensor(case.query_lens), 0)

    positions = torch.cat([torch.arange(s - q, s) for q, s in zip(case.query_lens, case.seq_lens)])
    limits = positions.clone()
    for req, lo, hi in case.spans:
        ctx = case.seq_lens[req] - case.query_lens[req]
        rows = int(qsl[req]) + torch.arange(max(lo, ctx), hi) - ctx
        limits[rows] = hi - 1

    def meta() -> AttentionMetadata:
        m = AttentionMetadata(
            num_tokens=t,
            query_start_loc=qsl.to(device),
            seq_lens=torch.tensor(case.seq_lens, dtype=torch.int64, device=device),
            slot_mapping=torch.cat(slots).to(device),
            block_tables=tables.to(device),
            query_lens_cpu=list(case.query_lens),
            seq_lens_cpu=list(case.seq_lens),
            block_size=bs,
        )
        if case.spans:
            m.key_limits_cpu, m.key_limits = limits, limits.to(device, torch.int32)
        return m

    return q.to(device), k.to(device), v.to(device), cache.to(device), meta


def run_case(case: Case, device: str | torch.device = "cpu") -> dict:
    """Run the Triton backend and the torch reference (in float32) on the same batch."""
    from cadence.attention.torch_ref import TorchAttentionBackend
    from cadence.attention.triton_paged import TritonAttentionBackend

    q, k, v, cache, meta = _make_batch(case, device)
    scale = case.head_dim**-0.5
    rotary = _rotary_tables(case, device) if case.rotary else None
    sinks = None
    if case.sinks:
        g = torch.Generator().manual_seed(case.seed + 1)
        sinks = (torch.randn(case.num_heads, generator=g) * 2).to(device)

    head_norm, q_normed, k_normed = None, q, k
    if case.head_norm:  # the model's modules norm q and k in the activation dtype
        q_norm, k_norm = (_head_norm_module(case, seed).to(device) for seed in (1, 2))
        with torch.no_grad():
            q_normed, k_normed = q_norm._norm(q), k_norm._norm(k)
        head_norm = (q_norm.weight, k_norm.weight, q_norm.eps, case.head_norm == "gemma")
    ref_cache = cache.float()
    ref_backend = TorchAttentionBackend()
    ref = ref_backend.forward(  # copies: a backend may rotate q and k in place
        q_normed.float().clone(),
        k_normed.float().clone(),
        v.float(),
        ref_cache,
        ref_backend.build(meta()),
        scale,
        tuple(c.float() for c in rotary) if rotary else None,
        window=case.window,
        softcap=case.softcap,
        sinks=sinks,
    )
    # The cache the backend must leave: the step's K (normed and rotated, by PyTorch's ops
    # in the activation dtype) and V copied into their slots.
    kn = k_normed
    want_k = kn if rotary is None else kn * rotary[0] + _rotate_half(kn) * rotary[1]
    want_cache = cache.clone()
    m = meta()
    want_cache[0].view(-1, case.num_kv_heads, case.head_dim)[m.slot_mapping] = want_k
    want_cache[1].view(-1, case.num_kv_heads, case.head_dim)[m.slot_mapping] = v

    backend = TritonAttentionBackend(
        num_kv_heads=case.num_kv_heads,
        split_kv=case.split_kv,
        split_min_partition=case.split_min_partition,
    )
    m = backend.build(m)
    if case.graph_plan:
        assert set(case.query_lens) == {1}, "a graph plan is for decode-only batches"
        m.backend_data = backend.decode_plan(
            len(case.query_lens), torch.device(device), split=bool(case.split_kv)
        )
    extra = {"head_norm": head_norm} if head_norm else {}
    out = backend.forward(  # (the raw q and k: kernel A norms them where head_norm says)
        q, k, v, cache, m, scale, rotary, window=case.window, softcap=case.softcap,
        sinks=sinks, **extra,
    )  # fmt: skip
    if device != "cpu":
        torch.cuda.synchronize()
    err = (out.float() - ref).abs()
    atol, rtol = TOLERANCE[case.dtype]
    bad = err > atol + rtol * ref.abs()
    return {
        "dtype_ok": out.dtype == q.dtype and out.shape == q.shape,
        "finite": bool(torch.isfinite(out).all()),
        "max_err": float(err.max()),
        "num_bad": int(bad.sum()),
        "cache_exact": bool(torch.equal(cache.isnan(), want_cache.isnan()))
        and _same_cache(
            cache.nan_to_num(), want_cache.nan_to_num(), exact=not (case.rotary or head_norm)
        ),
        "split_requests": int(m.backend_data.split_req.numel()),
        "cache_max_err": float(
            (cache.nan_to_num().float() - want_cache.nan_to_num().float()).abs().max()
        ),
    }


def _rotary_tables(case: Case, device) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin [T, 1, D] in the activation dtype at each query token's position, from
    the model's own table (Llama-3-like base)."""
    from types import SimpleNamespace

    from cadence.layers.rotary import RotaryEmbedding

    rope = RotaryEmbedding(SimpleNamespace(rope_theta=500000.0), case.head_dim, 8192)
    pos = torch.cat([torch.arange(s - q, s) for q, s in zip(case.query_lens, case.seq_lens)])
    cos, sin = rope.lookup(pos, DTYPES[case.dtype])
    return cos.to(device), sin.to(device)


def _head_norm_module(case: Case, seed: int):
    """An RMSNorm (or Gemma's) over one head, with random weights in the activation dtype."""
    from cadence.layers.norm import GemmaRMSNorm, RMSNorm

    norm = (GemmaRMSNorm if case.head_norm == "gemma" else RMSNorm)(case.head_dim, 1e-6)
    g = torch.Generator().manual_seed(case.seed * 10 + seed)
    with torch.no_grad():
        norm.weight.copy_(torch.randn(case.head_dim, generator=g) * 0.5 + 1.0)
    return norm.to(DTYPES[case.dtype])


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def _same_cache(got: torch.Tensor, want: torch.Tensor, exact: bool) -> bool:
    """Copies must be exact. Rotated keys round like PyTorch's ops, except that the compiler
    may contract a multiply and an add into one fused multiply-add (on an H200 it does,
    in 16-bit dtypes too), and the interpreter truncates float32 -> 16-bit casts where
    GPUs round to nearest: one unit in the last place is allowed, two interpreted."""
    if exact:
        return bool(torch.equal(got, want))
    eps = torch.finfo(got.dtype).eps * (2 if os.environ.get("TRITON_INTERPRET") == "1" else 1)
    return bool(torch.allclose(got.float(), want.float(), rtol=eps, atol=eps))


def run_write_kv_padding(device: str | torch.device = "cpu") -> dict:
    """Kernel A alone: exact copies, and slot -1 (a padding token) writes nothing."""
    from cadence.attention.triton_paged import TritonAttentionBackend

    gen = torch.Generator().manual_seed(0)
    cache = torch.randn(2, 6, 16, 3, 64, generator=gen).bfloat16()
    kv = torch.randn(5, 2, 3, 64, generator=gen).bfloat16()
    slots = torch.tensor([17, -1, 0, 95, 40])
    want = cache.clone()
    for t, s in enumerate(slots.tolist()):
        if s >= 0:
            want[:, s // 16, s % 16] = kv[t]
    cache, kv, slots = cache.to(device), kv.to(device), slots.to(device)
    TritonAttentionBackend().write_kv(kv[:, 0], kv[:, 1], cache, slots)
    return {"cache_exact": bool(torch.equal(cache.cpu(), want))}


def _check(case: Case, result: dict) -> None:
    assert "error" not in result, result.get("error")
    assert result["dtype_ok"]
    assert result["finite"], "NaN/inf in the output"
    assert result["num_bad"] == 0, f"max abs error {result['max_err']:.3g}"
    assert result["cache_exact"], (
        f"K/V write left a different cache ({result['cache_max_err']:.3g})"
    )
    if case.split_kv is True:
        assert result["split_requests"] == case.query_lens.count(1)
    elif case.split_kv is False:
        assert result["split_requests"] == 0


# ---- CPU: Triton's interpreter, in a child process -------------------------------------


@pytest.fixture(scope="module")
def interpreter_report() -> dict:
    return run_interpreter_child(__file__)


@needs_triton
@pytest.mark.parametrize("case", CPU_CASES, ids=lambda c: c.name)
def test_interpreter_matches_reference(case: Case, interpreter_report: dict) -> None:
    _check(case, interpreter_report[case.name])


@needs_triton
def test_interpreter_write_kv_skips_padding(interpreter_report: dict) -> None:
    result = interpreter_report["write_kv_padding"]
    assert "error" not in result, result.get("error")
    assert result["cache_exact"]


@needs_triton
def test_split_heuristic() -> None:
    """build() alone (no kernels): split few long decodes, leave big or short batches."""
    from cadence.attention.triton_paged import TritonAttentionBackend

    def plan(qlens, slens):
        case = Case("plan", tuple(qlens), tuple(slens), block_size=16)
        meta = _make_batch(case, "cpu")[-1]()
        return TritonAttentionBackend(num_kv_heads=8, num_sms=132).build(meta).backend_data

    p = plan([1], [8192])
    assert p.split_req.tolist() == [0] and p.work_req.numel() == 0
    assert p.num_parts == 32  # 8 kv heads x 32 partitions: 2 programs per SM
    assert plan([1] * 8, [4096] * 8).num_parts == 4
    assert plan([1] * 64, [2048] * 64).split_req.numel() == 0  # 512 programs already
    assert plan([1, 1], [300, 200]).split_req.numel() == 0  # short contexts
    assert plan([1, 512], [4096, 4096]).split_req.numel() == 0  # a prefill fills the GPU
    p = plan([1, 40, 1, 3], [10, 100, 1, 3])
    assert p.work_q == 64 and p.work_req.tolist() == [0, 1, 2, 3]
    p = plan([130, 1], [200, 5])
    assert p.work_req.tolist() == [0, 0, 0, 1] and p.work_qoff.tolist() == [0, 64, 128, 0]


# ---- GPU: compiled kernels at real sizes -----------------------------------------------

GPU_CASES = [
    Case("decode64_ctx1k_4k", (1,) * 64, tuple(1024 + 48 * i for i in range(64)), 32, 8, 128,
         dtype="bfloat16", split_kv=None),
    Case("prefill512_cached", (512, 512, 1, 1), (512, 3000, 2048, 4096), 32, 8, 128,
         dtype="bfloat16", split_kv=None),
    Case("split_b1_ctx8k", (1,), (8192,), 32, 8, 128, dtype="bfloat16", split_kv=None),
    Case("split_b4_ctx4k_fp16", (1, 1, 1, 1), (4096, 1000, 3333, 17), 32, 8, 128,
         dtype="float16", split_kv=True, split_min_partition=256),
    Case("mixed_d64_g1_bs32", (1, 100, 1, 37), (900, 1400, 5, 37), 16, 16, 64, 32, "bfloat16"),
    Case("mixed_fp32_g4", (1, 64, 1, 200), (2000, 64, 77, 900), 16, 4, 128, dtype="float32"),
    Case("mixed_bs64_g8", (1, 300, 1), (5000, 700, 129), 32, 4, 128, 64, "bfloat16"),
    _random_mixed(7, 48, 3000, num_heads=32, num_kv_heads=8, head_dim=128, dtype="bfloat16"),
    Case("rotary_decode64", (1,) * 64, tuple(100 + 7 * i for i in range(64)), 32, 8, 128,
         dtype="bfloat16", rotary=True),
    Case("rotary_prefill_fp16_d64", (300, 1), (300, 900), 16, 4, 64, dtype="float16",
         rotary=True),
    Case("prefill_8k", (8000,), (8000,), 32, 8, 128, dtype="bfloat16"),
    Case("graph_split_b1_ctx32k", (1,), (32000,), 32, 8, 128, dtype="bfloat16", split_kv=True,
         split_min_partition=256, graph_plan=True),
    Case("graph_split_b8_ctx4k_padded", (1,) * 8, (4000,) * 6 + (1, 1), 32, 8, 128,
         dtype="bfloat16", split_kv=True, split_min_partition=256, graph_plan=True),
    # The zoo's shapes: Mistral's window at 8k, Gemma 2 (head dim 256, soft-cap, window),
    # Phi-3 (head dim 96, window 2,047, one query head per kv head).
    Case("mistral_window_prefill_8k", (8000,), (8000,), 32, 8, 128, dtype="bfloat16",
         window=4096),
    Case("mistral_window_split_b1_8k", (1,), (8256,), 32, 8, 128, dtype="bfloat16",
         window=4096, split_kv=None),
    Case("gemma2_mixed_softcap_window", (1, 700, 1) + (1,) * 8, (5000, 3000, 90) + (600,) * 8,
         16, 8, 256, dtype="bfloat16", window=4096, softcap=50.0),
    Case("gemma2_decode64", (1,) * 64, tuple(300 + 50 * i for i in range(64)), 16, 8, 256,
         dtype="bfloat16", softcap=50.0, rotary=True),
    Case("phi3_mixed_rotary_d96", (1, 500, 1), (3000, 2500, 40), 32, 32, 96, dtype="bfloat16",
         window=2047, rotary=True),
    Case("phi3_decode64_d96", (1,) * 64, tuple(100 + 60 * i for i in range(64)), 32, 32, 96,
         dtype="bfloat16", window=2047),
    # Qwen3-30B-A3B: 32 query heads over 4, each head of q and k normed in kernel A.
    Case("qwen3_head_norm_decode64", (1,) * 64, tuple(100 + 7 * i for i in range(64)), 32, 4,
         128, dtype="bfloat16", rotary=True, head_norm="rms"),
    Case("qwen3_head_norm_prefill", (700, 1, 1), (700, 900, 40), 32, 4, 128, dtype="bfloat16",
         rotary=True, head_norm="rms"),
    # GPT-OSS-20B: 64 query heads over 8, head dim 64, sinks, window 128 on alternate layers.
    Case("gptoss_mixed_sinks_window", (1, 600, 1) + (1,) * 8, (3000, 900, 70) + (500,) * 8,
         64, 8, 64, dtype="bfloat16", window=128, sinks=True, rotary=True),
    Case("gptoss_split_b1_sinks", (1,), (8000,), 64, 8, 64, dtype="bfloat16", sinks=True,
         split_kv=True, split_min_partition=256),
    Case("gptoss_graph_split_sinks_window", (1, 1), (900, 3), 64, 8, 64, dtype="bfloat16",
         window=128, sinks=True, split_kv=True, graph_plan=True),
    # Gemma 3 with images (8 query heads over 4 of 256; 256-token images attended both
    # ways): two images in a 2k prompt chunk, one begun in a cached prefix, a window.
    Case("gemma3_images_mixed", (1, 2000, 1, 300), (900, 2000, 40, 400), 8, 4, 256,
         dtype="bfloat16", window=1024, spans=((1, 300, 556), (1, 1200, 1456), (3, 20, 276))),
]  # fmt: skip


@pytest.mark.gpu
@needs_triton
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_gpu_write_kv_skips_padding() -> None:
    assert run_write_kv_padding("cuda")["cache_exact"]


@pytest.mark.gpu
@needs_triton
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("case", GPU_CASES, ids=lambda c: c.name)
def test_gpu_matches_reference(case: Case) -> None:
    result = run_case(case, "cuda")
    _check(case, result)
    if case.name == "split_b1_ctx8k":
        assert result["split_requests"] == 1, "the heuristic should split a lone 8k decode"


# ---- the child process -----------------------------------------------------------------


def _interpreter_main() -> None:
    import traceback

    torch.set_num_threads(1)
    report = {}
    for case in CPU_CASES:
        try:
            report[case.name] = run_case(case)
        except Exception:
            report[case.name] = {"error": traceback.format_exc(limit=-4)}
    try:
        report["write_kv_padding"] = run_write_kv_padding()
    except Exception:
        report["write_kv_padding"] = {"error": traceback.format_exc(limit=-4)}
    print(json.dumps(report))


if __name__ == "__main__" and sys.argv[1:] == ["--interpreter-cases"]:
    assert os.environ.get("TRITON_INTERPRET") == "1"
    _interpreter_main()
