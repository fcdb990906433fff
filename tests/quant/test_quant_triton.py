"""The quantized Triton kernels against plain torch: the 4-bit planes matmul (GGUF on CUDA)
and the FP8 helpers (per-token activation quantization, the batch-1 e4m3 gemv).

On a CPU they run under Triton's interpreter, which reads TRITON_INTERPRET=1 when triton is
first imported, so the cases run in a child process started with it (this file as a
script) and report their errors as JSON; on a GPU (`@pytest.mark.gpu`) compiled, here."""

from __future__ import annotations

import importlib.util
import json
import os
import sys

import pytest
import torch
from interpreter_child import interpreter_report as run_interpreter_child

needs_triton = pytest.mark.skipif(
    importlib.util.find_spec("triton") is None, reason="triton is not installed"
)

# (format, rows, columns, batch rows, activation dtype)
PLANE_CASES = [
    ("Q4_1", 40, 256, 1, "float32"),
    ("Q8_0", 64, 128, 5, "float32"),
    ("Q6_K", 24, 256, 3, "float32"),
    ("Q4_K", 32, 256, 40, "bfloat16"),
    ("Q5_0", 16, 96, 2, "bfloat16"),
]


def plane_errors(device: str) -> dict[str, float]:
    """Relative max error of Int4Planes against the dequantized weight, per case."""
    from test_gguf_blocks import random_blocks

    from cadence.quant.gguf_blocks import decode, to_planes
    from cadence.quant.int4_triton import Int4Planes

    out = {}
    for kind, n, k, m, dtype_name in PLANE_CASES:
        dtype = getattr(torch, dtype_name)
        codes = decode(kind, random_blocks(kind, n, k, seed=n), (n, k))
        kernel = Int4Planes(to_planes(codes), torch.device(device))
        x = torch.randn(m, k, dtype=dtype, device=device)
        want = x.double() @ codes.dequantize().double().t().to(device)
        got = kernel(x).double()
        ids = torch.tensor([0, n - 1, 2], device=device)
        rows = kernel.rows(ids, torch.float32).double()
        want_rows = codes.dequantize().double()[ids.cpu()].to(device)
        out[f"{kind}-{m}-{dtype_name}"] = max(
            ((got - want).abs().max() / want.abs().max()).item(),
            ((rows - want_rows).abs().max() / want_rows.abs().max()).item(),
        )
    return out


def fp8_errors(device: str) -> dict[str, float]:
    from cadence.quant import fp8_kernels as fk

    torch.manual_seed(0)
    out = {}
    x = torch.randn(7, 300, dtype=torch.bfloat16, device=device) * 3
    x[3] = 0  # an all-zero row keeps a finite scale
    q, s = fk.quantize_per_token(x)
    ref_s = (x.float().abs().amax(1, keepdim=True) / fk.FP8_MAX).clamp(min=1e-12)
    ref_q = (x.float() / ref_s).clamp(-448, 448).to(fk.FP8)
    out["quant_scale"] = (s - ref_s).abs().max().item()
    out["quant_values"] = (q.float() - ref_q.float()).abs().max().item()
    w = torch.randn(48, 256, device=device)
    wq, ws = fk.quantize_weight(w)
    xr = torch.randn(1, 256, dtype=torch.bfloat16, device=device)
    bias = torch.randn(48, dtype=torch.bfloat16, device=device)
    want = xr.float() @ (wq.float() * ws[:, None]).t() + bias.float()
    got = fk.fp8_gemv(xr, wq, ws, bias).float()
    out["gemv"] = ((got - want).abs().max() / want.abs().max()).item()
    for m in (1, 5, 40):  # one, a few and a tile and a half of rows
        xm = torch.randn(m, 256, dtype=torch.bfloat16, device=device)
        xq, xs = fk.quantize_per_token(xm)
        want = (xq.float() * xs) @ (wq.float() * ws[:, None]).t() + bias.float()
        got = fk.fp8_mm(xq, xs, wq, ws, bias, torch.bfloat16, (32, 32, 64, 4, 2)).float()
        out[f"mm_{m}"] = ((got - want).abs().max() / want.abs().max()).item()
    xm = torch.randn(3, 96, dtype=torch.bfloat16, device=device)  # K = 96: a tail tile
    w96, ws96 = fk.quantize_weight(torch.randn(40, 96, device=device))
    xq, xs = fk.quantize_per_token(xm)
    want = (xq.float() * xs) @ (w96.float() * ws96[:, None]).t()
    got = fk.fp8_mm(xq, xs, w96, ws96, None, torch.bfloat16, (32, 32, 64, 4, 2)).float()
    out["mm_tail"] = ((got - want).abs().max() / want.abs().max()).item()
    return out


if __name__ == "__main__" and "--interpreter-cases" in sys.argv:
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    print(json.dumps({"planes": plane_errors("cpu"), "fp8": fp8_errors("cpu")}))
    sys.exit(0)


@pytest.fixture(scope="module")
def interpreter_report() -> dict:
    return run_interpreter_child(__file__)


def _check_planes(errors: dict[str, float]) -> None:
    assert len(errors) == len(PLANE_CASES)
    for case, err in errors.items():
        limit = 1e-5 if case.endswith("float32") else 2e-2  # bf16 activations and weights
        assert err < limit, f"{case}: relative error {err}"


def _check_fp8(errors: dict[str, float]) -> None:
    assert errors["quant_scale"] < 1e-6
    assert errors["quant_values"] == 0.0  # the same rounding as torch's cast
    assert errors["gemv"] < 1e-2  # bf16 output rounding
    for m in (1, 5, 40):
        assert errors[f"mm_{m}"] < 1e-2
    assert errors["mm_tail"] < 1e-2


@needs_triton
def test_int4_planes_under_the_interpreter(interpreter_report):
    _check_planes(interpreter_report["planes"])


@needs_triton
def test_fp8_kernels_under_the_interpreter(interpreter_report):
    _check_fp8(interpreter_report["fp8"])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_quant_kernels_on_the_gpu():
    _check_planes(plane_errors("cuda"))
    _check_fp8(fp8_errors("cuda"))
