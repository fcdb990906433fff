"""The Triton latent-attention kernel (cadence/attention/triton_mla.py) against the torch
backend's latent attention (one-head attention with K = V = latent), in float32.

CPU: under Triton's interpreter in a child process (see test_triton_paged.py for why);
GPU (`@pytest.mark.gpu`): DeepSeek's real widths (512 + 64) with compiled kernels.

Every case fills the cache with NaN (block 0 zeroed, as the model runner does) and writes
the cached prefixes directly, so an unmasked read of an unused slot would show as NaN.
Decode-only steps split their keys over programs (the SM count is set low or high to
choose how many), mixed steps run one program per sub-tile of tokens and heads.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass

import pytest
import torch
from interpreter_child import interpreter_report

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float8": torch.float8_e4m3fn}
TOLERANCE = {"float32": (2e-5, 1e-4), "bfloat16": (3e-2, 3e-2), "float8": (3e-2, 3e-2)}


@dataclass(frozen=True)
class Case:
    name: str
    query_lens: tuple[int, ...]
    seq_lens: tuple[int, ...]
    num_heads: int = 16
    latent: int = 32
    rope: int = 16
    block_size: int = 16
    dtype: str = "float32"
    cache_dtype: str | None = None  # None: the activations'
    num_sms: int = 132  # few: no key splits; many: up to 16
    graph_plan: bool = False  # the fixed decode plan a CUDA graph captures
    seed: int = 0


CPU_CASES = [
    Case("decode_split_keys", (1, 1, 1), (1, 40, 150)),
    Case("decode_one_program_each", (1, 1), (70, 33), num_sms=2),
    Case("mixed_chunks_and_decodes", (1, 17, 1, 33, 3), (200, 60, 9, 100, 3), block_size=8),
    Case("heads_past_one_block", (1, 9, 1), (90, 30, 61), num_heads=20),
    Case("few_heads_several_tokens_a_program", (5, 1, 40), (5, 77, 40), num_heads=4),
    Case("bf16_mixed", (1, 12, 1), (130, 40, 66), dtype="bfloat16"),
    Case("fp8_cache_decodes", (1, 1), (64, 100), dtype="bfloat16", cache_dtype="float8"),
    Case("graph_decodes_split", (1, 1, 1, 1), (1, 300, 45, 9), graph_plan=True),
    Case("long_chunk_several_items", (130, 1), (250, 300), num_heads=4),
    # 33 decodes: the many-decode tile, split in two at 132 SMs
    Case("decode_many_wide_tiles", (1,) * 33, tuple(range(3, 300, 9)), num_heads=4),
]
GPU_CASES = [
    Case("deepseek_decode_b1", (1,), (384,), 16, 512, 64, dtype="bfloat16"),
    Case("deepseek_decode_b8_128h", (1,) * 8, (1, 90, 500, 33, 2048, 7, 64, 300), 128, 512,
         64, dtype="bfloat16"),
    Case("deepseek_mixed", (1, 100, 1, 37), (900, 100, 20, 400), 16, 512, 64, dtype="bfloat16",
         block_size=64),
    Case("deepseek_float32", (1, 21, 1), (80, 50, 33), 16, 512, 64),
    Case("deepseek_decode_b48", (1,) * 48, tuple(range(1, 2400, 50)), 16, 512, 64,
         dtype="bfloat16"),
]  # fmt: skip


def run_case(case: Case, device: str | torch.device = "cpu") -> dict:
    from cadence.attention.base import AttentionMetadata
    from cadence.attention.torch_ref import TorchAttentionBackend
    from cadence.attention.triton_paged import TritonAttentionBackend

    gen = torch.Generator().manual_seed(case.seed)
    dtype = DTYPES[case.dtype]
    cache_dtype = DTYPES[case.cache_dtype or case.dtype]
    bs, width = case.block_size, case.latent + case.rope
    per_req = [-(-s // bs) for s in case.seq_lens]
    num_blocks = 1 + sum(per_req) + 2
    perm = (torch.randperm(num_blocks - 1, generator=gen) + 1).tolist()
    tables = torch.zeros(len(per_req), max(per_req) + 1, dtype=torch.int64)
    for b, n in enumerate(per_req):
        tables[b, :n] = torch.tensor(perm[:n])
        perm = perm[n:]
    store = torch.full((1, num_blocks, bs, 1, width), float("nan"))
    store[:, 0] = 0
    slots = []
    for b, (qlen, slen) in enumerate(zip(case.query_lens, case.seq_lens)):
        pos = torch.arange(slen)
        s = tables[b, pos // bs] * bs + pos % bs
        store.view(-1, width)[s[: slen - qlen]] = torch.randn(slen - qlen, width, generator=gen)
        slots.append(s[slen - qlen :])
    t = sum(case.query_lens)
    q = torch.randn(t, case.num_heads, width, generator=gen)
    latent = torch.randn(t, 1, width, generator=gen)
    qsl = torch.zeros(len(case.query_lens) + 1, dtype=torch.int64)
    qsl[1:] = torch.cumsum(torch.tensor(case.query_lens), 0)
    # Round everything to the dtypes first: both sides then read the same values.
    store = store.to(cache_dtype).float()
    q, latent = q.to(dtype).float(), latent.to(cache_dtype).float()

    def meta(device) -> AttentionMetadata:
        return AttentionMetadata(
            num_tokens=t,
            query_start_loc=qsl.to(device),
            seq_lens=torch.tensor(case.seq_lens, device=device),
            slot_mapping=torch.cat(slots).to(device),
            block_tables=tables.to(device),
            query_lens_cpu=list(case.query_lens),
            seq_lens_cpu=list(case.seq_lens),
            block_size=bs,
        )

    scale = 0.13
    ref_store = store.clone()
    ref_backend = TorchAttentionBackend()
    ref = ref_backend.forward_latent(
        q, latent, ref_store.expand(2, *store.shape[1:]), ref_backend.build(meta("cpu")), scale,
        case.latent,
    )  # fmt: skip
    cache = store.to(cache_dtype).to(device)
    backend = TritonAttentionBackend(num_kv_heads=1, split_kv=False, num_sms=case.num_sms)
    m = backend.build(meta(device))
    if case.graph_plan:
        m.backend_data = backend.decode_plan(len(case.query_lens), torch.device(device))
    out = backend.forward_latent(
        q.to(dtype).to(device), latent.to(dtype).to(device), cache.expand(2, *cache.shape[1:]),
        m, scale, case.latent,
    )  # fmt: skip
    err = (out.float().cpu() - ref).abs()
    atol, rtol = TOLERANCE[case.cache_dtype or case.dtype]
    written = cache.float().cpu().nan_to_num()
    return {
        "shape_ok": tuple(out.shape) == (t, case.num_heads, case.latent) and out.dtype == dtype,
        "finite": bool(torch.isfinite(out).all()),
        "max_err": float(err.max()),
        "num_bad": int((err > atol + rtol * ref.abs()).sum()),
        "cache_ok": bool(torch.equal(written, ref_store.nan_to_num())),
    }


def _check(result: dict) -> None:
    assert "error" not in result, result.get("error")
    assert result["shape_ok"]
    assert result["finite"], "NaN/inf in the output"
    assert result["num_bad"] == 0, f"max abs error {result['max_err']:.3g}"
    assert result["cache_ok"], "the latent write left a different cache"


@pytest.fixture(scope="module")
def interpreter_results() -> dict:
    return interpreter_report(__file__)


@pytest.mark.parametrize("case", CPU_CASES, ids=lambda c: c.name)
def test_latent_kernel_equals_reference_interpreted(case, interpreter_results):
    _check(interpreter_results[case.name])


@pytest.mark.gpu
@pytest.mark.parametrize("case", GPU_CASES, ids=lambda c: c.name)
def test_latent_kernel_equals_reference_on_gpu(case):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    _check(run_case(case, "cuda"))


def test_decode_splits_cover_the_sms_and_stop_at_sixteen():
    from cadence.attention.triton_mla import decode_splits

    assert decode_splits(1, 132) == 16
    assert decode_splits(16, 132) == 8  # 128 programs; 16 splits would be 256
    assert decode_splits(64, 132) == 2
    assert decode_splits(200, 132) == 1


if __name__ == "__main__" and sys.argv[1:2] == ["--interpreter-cases"]:
    assert os.environ.get("TRITON_INTERPRET") == "1"
    torch.set_num_threads(1)
    report = {}
    for case in CPU_CASES:
        try:
            report[case.name] = run_case(case)
        except Exception as exc:  # reported per case, so one failure names itself
            report[case.name] = {"error": f"{type(exc).__name__}: {exc}"}
    print(json.dumps(report))
