"""The fused CPU kernels equal the plain PyTorch ops they replace: exactly in bf16 (they
round where PyTorch rounds), and to the last bits of a float32 sum in float32."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from cadence.layers.activation import SiluAndMul
from cadence.layers.norm import GemmaRMSNorm, RMSNorm
from cadence.layers.rotary import _rotate_half
from cadence.ops import cpu_ops

pytestmark = pytest.mark.skipif(
    cpu_ops.ops() is None, reason="the CPU kernels did not build (no C++ compiler here)"
)
DTYPES = [torch.float32, torch.bfloat16]


def _close(got: torch.Tensor, want: torch.Tensor) -> None:
    assert got.dtype == want.dtype and got.shape == want.shape
    if got.dtype == torch.bfloat16:
        assert torch.equal(got, want)
    else:
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows", [1, 37])
def test_rms_norm_with_and_without_residual(dtype, rows):
    g = torch.Generator().manual_seed(rows)
    norm = RMSNorm(96, eps=1e-5).to(dtype)
    norm.weight.data = torch.randn(96, generator=g).to(dtype)
    x = torch.randn(rows, 96, generator=g).to(dtype)
    residual = torch.randn(rows, 96, generator=g).to(dtype)

    out, summed = norm(x, residual)  # the CPU kernel
    _close(summed, x + residual)
    _close(out, norm._norm(x + residual))  # the op-by-op reference
    _close(norm(x), norm._norm(x))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows", [1, 37])
def test_gemma_rms_norm_with_and_without_residual(dtype, rows):
    """Gemma's norm: the weight an offset from 1, the product in float32, one rounding."""
    g = torch.Generator().manual_seed(rows)
    norm = GemmaRMSNorm(96, eps=1e-6).to(dtype)
    norm.weight.data = (0.5 * torch.randn(96, generator=g)).to(dtype)
    x = torch.randn(rows, 96, generator=g).to(dtype)
    residual = torch.randn(rows, 96, generator=g).to(dtype)

    out, summed = norm(x, residual)
    _close(summed, x + residual)
    _close(out, norm._norm(x + residual))
    _close(norm(x), norm._norm(x))


@pytest.mark.parametrize("norm_class", [RMSNorm, GemmaRMSNorm])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("tokens", [1, 9])
def test_per_head_rms_norm_of_strided_views(norm_class, dtype, tokens, monkeypatch):
    """Qwen3's and Gemma 3's q / k norms: [T, H, D] views of the fused qkv, each head a row
    of the kernel."""
    kernel, calls = cpu_ops.ops().add_rms_norm, []
    monkeypatch.setattr(
        cpu_ops.ops(), "add_rms_norm", lambda *a: calls.append(a[0].shape) or kernel(*a)
    )
    g = torch.Generator().manual_seed(tokens)
    hq, hkv, d = 4, 2, 32
    qkv = torch.randn(tokens, (hq + 2 * hkv) * d, generator=g).to(dtype)
    q = qkv[:, : hq * d].view(tokens, hq, d)  # (not contiguous: rows of qkv's width)
    norm = norm_class(d, eps=1e-6).to(dtype)
    norm.weight.data = torch.randn(d, generator=g).to(dtype)
    before = qkv.clone()

    _close(norm(q), norm._norm(q))
    assert calls == [(tokens * hq, d)]  # one call, a row per head
    assert torch.equal(qkv, before)  # (the view is read, not normed in place)


@pytest.mark.parametrize("dtype", DTYPES)
def test_silu_and_mul(dtype):
    x = torch.randn(5, 2 * 48, generator=torch.Generator().manual_seed(1)).to(dtype)
    gate, up = x.chunk(2, dim=-1)
    _close(SiluAndMul()(x), F.silu(gate) * up)


@pytest.mark.parametrize("dtype", DTYPES)
def test_rotary_rotates_strided_views_in_place(dtype):
    g = torch.Generator().manual_seed(2)
    tokens, hq, hkv, d = 6, 4, 2, 16
    qkv = torch.randn(tokens, (hq + 2 * hkv) * d, generator=g).to(dtype)
    q = qkv[:, : hq * d].view(tokens, hq, d)  # strided views, as the model passes them
    k = qkv[:, hq * d : (hq + hkv) * d].view(tokens, hkv, d)
    cos = torch.randn(tokens, 1, d, generator=g).to(dtype)
    sin = torch.randn(tokens, 1, d, generator=g).to(dtype)
    want_q = q * cos + _rotate_half(q) * sin
    want_k = k * cos + _rotate_half(k) * sin
    v_before = qkv[:, (hq + hkv) * d :].clone()

    cpu_ops.ops().rotary_(q, k, cos, sin)
    _close(q, want_q)
    _close(k, want_k)
    assert torch.equal(qkv[:, (hq + hkv) * d :], v_before)  # v untouched


def test_bad_shapes_raise_instead_of_reading_out_of_bounds():
    ops = cpu_ops.ops()
    with pytest.raises(RuntimeError, match="residual must match"):
        ops.add_rms_norm(torch.randn(2, 8), torch.randn(3, 8), torch.ones(8), 1e-6)
    with pytest.raises(RuntimeError, match="block table too short"):
        ops.paged_attention(
            torch.empty(1, 2, 4),
            torch.randn(1, 2, 4),
            torch.randn(8, 1, 4),
            torch.randn(8, 1, 4),
            torch.zeros(1, 1, dtype=torch.int64),  # one block of 4 slots ...
            torch.zeros(1, dtype=torch.int64),
            torch.ones(1, dtype=torch.int64),
            torch.tensor([6]),  # ... for 6 keys
            4,
            0.5,
            0,
            0.0,
        )
