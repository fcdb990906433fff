"""An FP8 (e4m3) KV cache: each backend stores k / k_scale and v / v_scale, saturated, and
attends over the widened values times the scales. The reference is the float32 torch
backend over a cache holding exactly the values the FP8 one represents.

CPU: the Triton kernels run under the interpreter in a child process (as in
test_triton_paged.py); the torch backend runs here. GPU: both, compiled."""

from __future__ import annotations

import json
import sys

import pytest
import torch
from interpreter_child import interpreter_report as run_interpreter_child
from test_triton_paged import Case, _make_batch, needs_triton

F8 = torch.float8_e4m3fn
SCALES = (0.05, 0.03)  # k_scale, v_scale: values up to 22 and 13 before saturating

CASES = [
    Case("fp8_decodes", (1, 1, 1), (1, 37, 150)),
    Case("fp8_mixed_bf16_g4", (1, 9, 1), (90, 30, 140), 4, 1, 128, dtype="bfloat16"),
    Case("fp8_prefill_g2", (5, 40), (5, 60), 4, 2),
    Case("fp8_split_bf16", (1, 12, 1), (260, 40, 90), 4, 1, 64, dtype="bfloat16", split_kv=True),
]


def _stored(x: torch.Tensor, scale: float) -> torch.Tensor:
    return (x.float() / scale).clamp(-448, 448).to(F8)


def run_fp8_case(case: Case, backend_name: str, device: str = "cpu") -> dict:
    from cadence.attention.torch_ref import TorchAttentionBackend
    from cadence.attention.triton_paged import TritonAttentionBackend

    ks, vs = SCALES
    q, k, v, cache, meta = _make_batch(case, device)
    k, v = k * 8, v * 8  # some values saturate: the write must clamp, not overflow to NaN
    fp8 = torch.stack([_stored(cache[0], ks), _stored(cache[1], vs)])
    ref_cache = torch.stack([fp8[0].float() * ks, fp8[1].float() * vs])
    ref_k, ref_v = _stored(k, ks).float() * ks, _stored(v, vs).float() * vs
    ref_backend = TorchAttentionBackend()
    scale = case.head_dim**-0.5
    ref = ref_backend.forward(q.float(), ref_k, ref_v, ref_cache, ref_backend.build(meta()), scale)

    if backend_name == "torch":
        backend = TorchAttentionBackend()
    else:
        backend = TritonAttentionBackend(num_kv_heads=case.num_kv_heads, split_kv=case.split_kv)
    m = backend.build(meta())
    out = backend.forward(q, k, v, fp8, m, scale, None, SCALES)
    written = torch.stack([fp8[0].float() * ks, fp8[1].float() * vs])
    slots = m.slot_mapping
    flat = written.view(2, -1, case.num_kv_heads, case.head_dim)
    want = torch.stack([ref_k, ref_v])
    err = (out.float() - ref).abs()
    return {
        "max_err": float(err.max()),
        "ref_max": float(ref.abs().max()),
        "finite": bool(torch.isfinite(out).all()),
        # The written slots hold the step's K/V at FP8 precision (one e4m3 step at most:
        # x / s and x * (1 / s) may round apart before the cast).
        "write_err": float(((flat[:, slots] - want).abs() / (want.abs() + 1e-3)).max()),
        "saturated": bool((flat[0, slots].abs() >= 448 * ks * 0.999).any()),
    }


def _check(result: dict, dtype: str) -> None:
    assert result["finite"]
    # e4m3 carries 3 mantissa bits; the inputs are already FP8 values, so what remains is
    # accumulation order and, in bf16, the products' rounding.
    limit = 2e-3 if dtype == "float32" else 3e-2
    assert result["max_err"] <= limit * max(1.0, result["ref_max"]), result
    assert result["write_err"] <= 0.13, result
    assert result["saturated"]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_torch_backend_reads_back_what_it_stored(case):
    _check(run_fp8_case(case, "torch"), case.dtype)


def test_pool_blocks_take_half_the_bytes():
    from types import SimpleNamespace

    from cadence.worker.kv_tensors import kv_bytes_per_block

    attn = SimpleNamespace(num_kv_heads=2, head_dim=64)
    model = SimpleNamespace(attention_layers=lambda: [attn] * 3)
    assert kv_bytes_per_block(model, 16, F8) * 2 == kv_bytes_per_block(model, 16, torch.bfloat16)


if __name__ == "__main__" and sys.argv[1:] == ["--interpreter-cases"]:
    print(json.dumps({c.name: run_fp8_case(c, "triton") for c in CASES}))
    sys.exit(0)


@pytest.fixture(scope="module")
def interpreter_report() -> dict:
    return run_interpreter_child(__file__)


@needs_triton
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_triton_kernels_under_the_interpreter(case, interpreter_report):
    _check(interpreter_report[case.name], case.dtype)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_triton_kernels_on_the_gpu(case):
    _check(run_fp8_case(case, "triton", "cuda"), case.dtype)
    _check(run_fp8_case(case, "torch", "cuda"), case.dtype)
