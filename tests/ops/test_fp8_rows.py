"""Rows of activations to FP8 with a scale each (cadence/ops/fp8_rows.py): each row scaled
so its largest magnitude is 448 (torch's bits exactly, on a GPU too), an all-zero row with
a finite scale; the gated form is fused.silu_and_mul's rows (the same rounding of the
activation first) to within the quantization's half step, at a W8A8 MLP's widths."""

from __future__ import annotations

import pytest
import torch
from interpreter_helpers import check_all_under_interpreter

from cadence.ops import fp8_rows


def reference(v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    scale = (v.float().abs().amax(1, keepdim=True) / 448.0).clamp(min=1e-12)
    return (v.float() / scale).clamp(-448.0, 448.0).to(torch.float8_e4m3fn), scale


def silu_mul(h: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up rounded as fused.silu_and_mul rounds: the activation, then the product."""
    gate, up = h.chunk(2, dim=1)
    act = (gate.float() / (1.0 + torch.exp(-gate.float()))).to(h.dtype)
    return (act.float() * up.float()).to(h.dtype)


def check_rows(device: str, width: int) -> None:
    torch.manual_seed(0)
    x = torch.randn(9, width, device=device).bfloat16() * 3
    x[4] = 0  # an all-zero row keeps a finite scale
    q, s = fp8_rows.quantize_rows(x)
    want_q, want_s = reference(x)
    assert q.dtype == torch.float8_e4m3fn and s.shape == (9, 1)
    assert torch.equal(s, want_s), (s - want_s).abs().max()
    differ = q.view(torch.uint8) != want_q.view(torch.uint8)
    assert not differ.any(), f"{differ.sum().item()} of {q.numel()} values differ"
    check_gated(device, width, rows=9)


def check_gated(device: str, width: int, rows: int) -> None:
    """The gated rows' dequantized values are silu(gate) * up to within the quantization's
    half step (1/16 of a normal e4m3 value, half the subnormal step near zero), plus a
    bf16 step for the activation's rounding (exp's last bit differs between devices)."""
    torch.manual_seed(1)
    h = torch.randn(rows, 2 * width, device=device).bfloat16() * 2
    h[2] = 0
    q, s = fp8_rows.silu_mul_quantize(h)
    assert q.shape == (rows, width) and s.shape == (rows, 1)
    want = silu_mul(h).float()
    want_s = (want.abs().amax(1, keepdim=True) / 448.0).clamp(min=1e-12)
    torch.testing.assert_close(s, want_s, rtol=8e-3, atol=0)  # (a bf16 step, at most)
    error = (q.float() * s - want).abs()
    bound = want.abs() * (1 / 16 + 1 / 128) + s * 2.0**-10
    assert (error <= bound).all(), (error - bound).max()


@pytest.mark.parametrize("width", [300, 768])
def test_rows_quantized_on_the_cpu(width):
    check_rows("cpu", width)


def kernel_values(x: torch.Tensor, k: int, gated: bool, config: dict):
    """The Triton kernel's scales and its values before the e4m3 cast (a float32 output
    buffer: the interpreter's casts to e4m3 round unlike a GPU's)."""
    import triton

    m = x.shape[0]
    q = torch.empty((m, k), dtype=torch.float32)
    s = torch.empty((m, 1), dtype=torch.float32)
    launch = {key: v for key, v in config.items() if key != "num_warps"}
    fp8_rows._quant_rows_kernel[(triton.cdiv(m, launch["ROWS"]),)](
        x, q, s, m, k, x.stride(0), q.stride(0), GATED=gated, **launch
    )
    return q, s


def check_all(device: str) -> None:
    """Under Triton's interpreter: the kernel's layouts (several rows a program in one pass,
    a partial last program, wide rows in two passes) give torch's scales and values."""
    torch.manual_seed(0)
    for k in (3, 300, 2048, 5000):
        x = torch.randn(13, k) * 3
        x[5] = 0
        amax = x.abs().amax(1, keepdim=True)
        want_s = (amax * torch.tensor(1 / 448.0)).clamp(min=1e-12)  # (as the GPU computes it)
        want_q = (x / want_s).clamp(-448.0, 448.0)
        for config in (fp8_rows.launch_config(k, False), dict(ROWS=4, BLOCK=64, ONE_PASS=False)):
            q, s = kernel_values(x, k, False, config)
            assert torch.equal(s, want_s) and torch.equal(q, want_q), (k, config)
        # gated rows, in float32 (no 16-bit rounding of the activation to mirror)
        h = torch.randn(13, 2 * k) * 2
        gate, up = h.chunk(2, dim=1)
        act = gate / (1.0 + torch.exp(-gate)) * up
        want_s = (act.abs().amax(1, keepdim=True) * torch.tensor(1 / 448.0)).clamp(min=1e-12)
        for config in (fp8_rows.launch_config(k, True), dict(ROWS=2, BLOCK=128, ONE_PASS=False)):
            q, s = kernel_values(h, k, True, config)
            torch.testing.assert_close(s, want_s, rtol=1e-5, atol=0)
            torch.testing.assert_close(q, (act / s).clamp(-448.0, 448.0), rtol=1e-5, atol=1e-5)


def test_the_kernel_under_the_interpreter():
    pytest.importorskip("triton", reason="triton is not installed")
    check_all_under_interpreter("test_fp8_rows")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("width", [300, 768, 14336])  # a tail, Qwen3-30B-A3B's, Mixtral's
def test_rows_quantized_on_cuda(width):
    check_rows("cuda", width)
    check_gated("cuda", width, rows=65)
