"""The fused Triton kernels of cadence/ops/fused.py, and the batch-1 gemv of
cadence/ops/gemv.py, equal the PyTorch layers they replace.

On a CPU they run through Triton's interpreter, in a child process (TRITON_INTERPRET must
be set before triton is imported, and this process may have imported it already)."""

from __future__ import annotations

import pytest
import torch
from interpreter_helpers import check_all_under_interpreter

triton = pytest.importorskip("triton", reason="triton is not installed")


def check_all(device: str) -> None:
    from cadence.layers.activation import SiluAndMul
    from cadence.layers.norm import GemmaRMSNorm, RMSNorm
    from cadence.layers.rotary import _rotate_half
    from cadence.ops import fused

    torch.manual_seed(0)
    for dtype, tol in ((torch.float32, 1e-5), (torch.bfloat16, 2e-2)):
        # RMSNorm, with and without the residual; an odd width (masked columns).
        for width in (64, 100):
            norm = RMSNorm(width, 1e-6).to(device, dtype)
            norm.weight.data.uniform_(0.5, 1.5)
            x = torch.randn(5, width, device=device, dtype=dtype)
            r = torch.randn(5, width, device=device, dtype=dtype)
            torch.testing.assert_close(
                fused.rms_norm(x, norm.weight, norm.eps), norm._norm(x), atol=tol, rtol=tol
            )
            got, got_res = fused.add_rms_norm(x, r, norm.weight, norm.eps)
            want, want_res = RMSNorm.forward(norm, x, r)
            # Exact in float32; bf16 within a rounding step (the interpreter truncates
            # float32 -> bf16 where GPUs round to nearest).
            exact = dtype == torch.float32
            torch.testing.assert_close(
                got_res, want_res, atol=0 if exact else tol, rtol=0 if exact else tol
            )
            torch.testing.assert_close(got, want, atol=tol, rtol=tol)
        # Per-head norms (Qwen3's q / k): heads of a strided [T, H, D] view of a wider row;
        # 148 heads, several to a program, the last program's rows cut short.
        norm = RMSNorm(32, 1e-6).to(device, dtype)
        norm.weight.data.uniform_(0.5, 1.5)
        qkv = torch.randn(37, 4 * 32 + 24, device=device, dtype=dtype)
        q = qkv[:, : 4 * 32].view(37, 4, 32)
        got = fused.rms_norm(q, norm.weight, norm.eps)
        assert got.shape == (37, 4, 32)
        torch.testing.assert_close(got, norm._norm(q), atol=tol, rtol=tol)
        gnorm = GemmaRMSNorm(32, 1e-6).to(device, dtype)
        gnorm.weight.data.uniform_(-0.5, 0.5)
        got = fused.rms_norm(q, gnorm.weight, gnorm.eps, gemma=True)
        torch.testing.assert_close(got, gnorm._norm(q), atol=tol, rtol=tol)
        # rows as wide as a program's tile (one row a program), with the residual
        norm = RMSNorm(2048, 1e-6).to(device, dtype)
        x, r = (torch.randn(3, 2048, device=device, dtype=dtype) for _ in range(2))
        got, got_res = fused.add_rms_norm(x, r, norm.weight, norm.eps)
        want, want_res = RMSNorm.forward(norm, x, r)
        torch.testing.assert_close(got, want, atol=tol, rtol=tol)
        torch.testing.assert_close(got_res, want_res, atol=tol, rtol=tol)
        # Gemma's RMSNorm (weight as an offset from 1, one rounding), with the residual.
        norm = GemmaRMSNorm(100, 1e-6).to(device, dtype)
        norm.weight.data.uniform_(-0.5, 0.5)
        x = torch.randn(5, 100, device=device, dtype=dtype)
        r = torch.randn(5, 100, device=device, dtype=dtype)
        torch.testing.assert_close(
            fused.rms_norm(x, norm.weight, norm.eps, gemma=True), norm._norm(x), atol=tol, rtol=tol
        )
        got, got_res = fused.add_rms_norm(x, r, norm.weight, norm.eps, gemma=True)
        torch.testing.assert_close(got, norm._norm(x + r), atol=tol, rtol=tol)
        torch.testing.assert_close(got_res, x + r, atol=tol, rtol=tol)
        # A sandwich's post-block norm, the residual add and the next pre-block norm in
        # one launch (Gemma's kind and Llama's): as the three ops, within rounding (the
        # norms' sums run in another order than torch's reductions).
        for kind, low, high in ((GemmaRMSNorm, -0.5, 0.5), (RMSNorm, 0.5, 1.5)):
            post, pre = kind(100, 1e-6).to(device, dtype), kind(100, 1e-5).to(device, dtype)
            post.weight.data.uniform_(low, high)
            pre.weight.data.uniform_(low, high)
            got, got_res = fused.norm_add_rms_norm(
                x, r, (post.weight, post.eps), pre.weight, pre.eps, gemma=kind is GemmaRMSNorm
            )
            want_res = post._norm(x) + r
            torch.testing.assert_close(got_res, want_res, atol=tol, rtol=tol)
            torch.testing.assert_close(got, pre._norm(want_res), atol=tol, rtol=tol)
        # SiLU (and GeGLU's tanh GELU) and mul, over a strided view (rows of a wider buffer).
        buf = torch.randn(4, 2 * 48 + 8, device=device, dtype=dtype)
        x = buf[:, : 2 * 48]
        torch.testing.assert_close(fused.silu_and_mul(x), SiluAndMul()(x), atol=tol, rtol=tol)
        # several rows a program, the last program's cut short; a width past one block
        for rows, width in ((37, 100), (5, 1100)):
            y = torch.randn(rows, 2 * width, device=device, dtype=dtype)
            torch.testing.assert_close(fused.silu_and_mul(y), SiluAndMul()(y), atol=tol, rtol=tol)
        gate, up = x.chunk(2, dim=-1)
        torch.testing.assert_close(
            fused.silu_and_mul(x, gelu_tanh=True),
            torch.nn.functional.gelu(gate, approximate="tanh") * up,
            atol=tol,
            rtol=tol,
        )
        # Rotary in place on q / k views of a fused qkv buffer, GQA 4:2, head_dim 16.
        t, hq, hk, d = 6, 4, 2, 16
        qkv = torch.randn(t, (hq + 2 * hk) * d, device=device, dtype=dtype)
        q = qkv[:, : hq * d].view(t, hq, d)
        k = qkv[:, hq * d : (hq + hk) * d].view(t, hk, d)
        ang = torch.randn(t, 1, d, device=device)
        cos, sin = ang.cos().to(dtype), ang.sin().to(dtype)
        want_q = q * cos + _rotate_half(q) * sin
        want_k = k * cos + _rotate_half(k) * sin
        v_before = qkv[:, (hq + hk) * d :].clone()
        fused.rotary_(q, k, cos, sin)
        torch.testing.assert_close(q, want_q, atol=tol, rtol=tol)
        torch.testing.assert_close(k, want_k, atol=tol, rtol=tol)
        assert torch.equal(qkv[:, (hq + hk) * d :], v_before)  # v untouched
        # gemv: one row through a linear layer; K not a multiple of the tile, N not of the
        # row block (masked edges), with and without a bias.
        from cadence.ops.gemv import gemv, rms_norm_gemv, silu_mul_gemv

        for n, k, bias in ((40, 1100, True), (16, 64, False)):
            layer = torch.nn.Linear(k, n, bias=bias).to(device, dtype)
            x = torch.randn(1, k, device=device, dtype=dtype)
            gtol = 1e-4 if dtype == torch.float32 else 3e-2
            torch.testing.assert_close(
                gemv(x, layer.weight, layer.bias), layer(x), atol=gtol, rtol=gtol
            )
            # The residual add and RMSNorm folded in: equal to RMSNorm then the layer, and
            # the residual stream exactly x + residual (as the unfused add rounds it).
            norm = RMSNorm(k, 1e-5).to(device, dtype)
            norm.weight.data.uniform_(0.5, 1.5)
            r = torch.randn(1, k, device=device, dtype=dtype)
            want, want_res = RMSNorm.forward(norm, x, r)
            got, got_res = rms_norm_gemv(x, r, norm.weight, norm.eps, layer.weight, layer.bias)
            torch.testing.assert_close(got, layer(want), atol=gtol, rtol=gtol)
            assert torch.equal(got_res, want_res) or dtype != torch.float32
            torch.testing.assert_close(got_res, want_res, atol=tol, rtol=tol)
            got, same = rms_norm_gemv(x, None, norm.weight, norm.eps, layer.weight, layer.bias)
            torch.testing.assert_close(got, layer(norm._norm(x)), atol=gtol, rtol=gtol)
            assert same is x  # no residual yet: the stream is x itself
            # keep_normed (a mixture's router): the normed row too, as RMSNorm rounds it.
            got, normed, got_res = rms_norm_gemv(
                x, r, norm.weight, norm.eps, layer.weight, layer.bias, keep_normed=True
            )
            torch.testing.assert_close(got, layer(want), atol=gtol, rtol=gtol)
            torch.testing.assert_close(normed, want, atol=tol, rtol=tol)
            torch.testing.assert_close(got_res, want_res, atol=tol, rtol=tol)
            # SiLU-and-mul folded into the next projection: gate_up is [gate | up], 2K wide.
            gate_up = torch.randn(1, 2 * k, device=device, dtype=dtype)
            torch.testing.assert_close(
                silu_mul_gemv(gate_up, layer.weight, layer.bias),
                layer(SiluAndMul()(gate_up)),
                atol=gtol,
                rtol=gtol,
            )
        # argmax of long rows: ties go to the first index, as torch.argmax; a NaN wins.
        logits = torch.randn(3, 5000, device=device).to(dtype)
        logits[1, 4097] = logits[1, 123] = 50.0  # a tie across two chunks
        logits[2, 4999] = 60.0  # the last, partial chunk
        assert fused.argmax_rows(logits).tolist() == logits.argmax(-1).tolist()
        assert fused.argmax_rows(logits)[1].item() == 123
        logits[0, 77] = float("nan")
        assert fused.argmax_rows(logits)[0].item() == 77
        one = torch.randn(1, 128256, device=device).to(dtype)
        assert fused.argmax_rows(one).tolist() == one.argmax(-1).tolist()


def test_fused_kernels_under_the_interpreter():
    check_all_under_interpreter("test_fused")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_fused_kernels_on_cuda():
    check_all("cuda")
