"""GGUF codes in 16-row panels (cadence/quant/gguf_cpu.py, cadence/csrc/cpu/panel_gemm.cpp):
every format multiplies as its dequantized weight does, at every batch size the tiles cut
(1 to 6 rows, the remainders, the prefill path), in float32 and bf16; the vector tile (AVX-512 or AVX2, as built) equals
the portable loop; the vocabulary's one table serves lookups and logits."""

import pytest
import torch
from test_gguf_blocks import random_blocks

from cadence.quant import gguf_cpu
from cadence.quant.gguf_blocks import BLOCKS, decode

pytestmark = pytest.mark.skipif(
    not gguf_cpu.available(), reason="the CPU kernels did not build here (no C++ compiler)"
)


def codes_of(kind: str, n: int, k: int, seed: int = 0):
    return decode(kind, random_blocks(kind, n, k, seed), (n, k))


@pytest.mark.parametrize("kind", sorted(BLOCKS))
def test_every_format_multiplies_as_its_dequantized_weight(kind):
    n, k = 37, 512  # 37 rows: three panels, the last one cut short
    codes = codes_of(kind, n, k)
    panels = gguf_cpu.PanelsCPU(codes)
    weight = codes.dequantize().double()
    for rows in (1, 2, 3, 4, 5, 6, 7, 13, gguf_cpu.EXPAND_ROWS + 1):
        x = torch.randn(rows, k)
        want = (x.double() @ weight.t()).float()
        got = panels(x)
        assert got.shape == (rows, n) and got.dtype == torch.float32
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5 * want.abs().max().item())


@pytest.mark.parametrize("rows", [1, 6, 9, gguf_cpu.EXPAND_ROWS])
def test_bf16_activations_sum_in_float32_and_round_once(rows):
    codes = codes_of("Q4_1", 40, 256)
    x = torch.randn(rows, 256, dtype=torch.bfloat16)
    panels = gguf_cpu.PanelsCPU(codes)
    panels.int8_activations = False  # the float path (int8 activations: tests below)
    panels.bf16_tiles = False  # (from 16 rows the AMX-BF16 tiles would run: tests below)
    got = panels(x)
    weight = codes.dequantize().double()
    want = (x.double() @ weight.t()).to(torch.bfloat16)
    assert got.dtype == torch.bfloat16
    # one rounding to bf16 (half an ulp: 2^-8 relative) and float32 sums
    bound = want.double().abs() * 2**-7 + 1e-3
    if rows >= gguf_cpu.EXPAND_ROWS and gguf_cpu.gemm_dtype(torch.bfloat16) == torch.bfloat16:
        # where oneDNN has a bf16 GEMM (AVX-512 BF16, AMX) the expansion is bf16: each
        # weight rounded once more
        bound += (x.double().abs() @ weight.abs().t()) * 2**-8
    assert ((got.double() - want.double()).abs() <= bound).all()


def test_products_that_expand_one_after_another_each_use_their_own_weight():
    """Prefill-sized products expand W^T into one shared buffer: each product's result is
    its own weight's, whatever expanded there before (a larger weight, then a smaller)."""
    big, small = (gguf_cpu.PanelsCPU(codes_of("Q4_1", n, 256)) for n in (96, 40))
    rows = big.expand_rows(torch.bfloat16) or gguf_cpu.EXPAND_ROWS
    x = torch.randn(rows, 256, dtype=torch.bfloat16)
    for panels in (big, small, big, small):
        assert torch.equal(panels(x), torch.mm(x, panels.expand(torch.bfloat16)))


@pytest.mark.parametrize("kind", ["Q4_0", "Q8_0", "Q6_K", "Q5_K"])
def test_the_vector_tile_equals_the_portable_loop(kind):
    codes = codes_of(kind, 50, 256)
    panels = gguf_cpu.PanelsCPU(codes)
    for rows in (1, 4, 6, 11, 12, 25):  # AVX2 tiles of 6 rows, AVX-512 of 12
        x = torch.randn(rows, 256)
        fast, portable = torch.empty(rows, 50), torch.empty(rows, 50)
        panels.ops.panel_gemm(fast, x, panels.q, panels.sc, panels.group, panels.bits, False)
        panels.ops.panel_gemm(portable, x, panels.q, panels.sc, panels.group, panels.bits, True)
        # the vector tile unpacks with one rounding (a fused multiply-add), the loop with two
        scale = portable.abs().max().item()
        torch.testing.assert_close(fast, portable, rtol=1e-5, atol=1e-5 * scale)


def test_scales_stay_float16_only_where_exact():
    """Q4_0 / Q4_1 / Q8_0 keep the file's fp16 numbers; the K formats' products of two
    scales need float32 (and are not rounded to fit)."""
    assert gguf_cpu.PanelsCPU(codes_of("Q4_1", 16, 64)).sc.dtype == torch.float16
    assert gguf_cpu.PanelsCPU(codes_of("Q8_0", 16, 64)).sc.dtype == torch.float16
    k_quant = gguf_cpu.PanelsCPU(codes_of("Q4_K", 16, 256))
    assert k_quant.sc.dtype == torch.float32
    assert k_quant.bits == 4 and gguf_cpu.PanelsCPU(codes_of("Q6_K", 16, 256)).bits == 8


def test_codes_of_four_bits_take_half_a_byte():
    n, k = 64, 512
    four = gguf_cpu.PanelsCPU(codes_of("Q4_1", n, k))
    eight = gguf_cpu.PanelsCPU(codes_of("Q8_0", n, k))
    assert four.q.numel() == n * k // 2 and eight.q.numel() == n * k


@pytest.mark.parametrize("kind", ["Q4_K", "Q4_1", "Q8_0", "Q6_K"])
def test_expansion_and_row_lookups_are_the_dequantized_values(kind):
    codes = codes_of(kind, 45, 256)  # two whole panels and one of 13 rows
    panels = gguf_cpu.PanelsCPU(codes)
    weight = codes.dequantize()
    assert torch.equal(panels.expand(torch.float32), weight.t())
    assert torch.equal(panels.expand(torch.bfloat16), weight.t().to(torch.bfloat16))
    ids = torch.tensor([[44, 0], [17, 17]])
    assert torch.equal(panels.rows(ids, torch.float32), weight[ids])
    assert torch.equal(panels.rows(ids, torch.bfloat16), weight[ids].to(torch.bfloat16))


def test_a_lookup_outside_the_table_raises():
    panels = gguf_cpu.PanelsCPU(codes_of("Q8_0", 20, 64))  # 20 rows, padded to 32
    for bad in (20, 31, -1):
        with pytest.raises(RuntimeError, match="outside the table"):
            panels.rows(torch.tensor([0, bad]), torch.float32)


def test_malformed_panels_are_refused_not_read():
    panels = gguf_cpu.PanelsCPU(codes_of("Q4_1", 32, 64))
    x, out = torch.randn(2, 64), torch.empty(2, 32)
    with pytest.raises(RuntimeError, match="q must be"):
        panels.ops.panel_gemm(out, x, panels.q[:1], panels.sc, 32, 4, False)
    with pytest.raises(RuntimeError, match="sc must be"):
        panels.ops.panel_gemm(out, x, panels.q, panels.sc.float()[:1], 32, 4, False)
    with pytest.raises(RuntimeError, match="group"):
        panels.ops.panel_gemm(out, x, panels.q, panels.sc, 48, 4, False)


def test_prefill_products_expand_only_where_onednn_has_a_native_16bit_gemm(monkeypatch):
    """Without one (AVX2) the panels' buffered tiles beat expanding W^T for oneDNN's float32
    GEMM at every size measured; with one (AVX-512 BF16, AMX) its 16-bit GEMM wins."""
    native = torch.ops.mkldnn._is_mkldnn_bf16_supported()
    assert gguf_cpu.native_16bit(torch.bfloat16) == native
    assert not gguf_cpu.native_16bit(torch.float32)
    panels = gguf_cpu.PanelsCPU(codes_of("Q4_1", 32, 64))
    expanded, expand = [], panels.expand
    monkeypatch.setattr(
        panels, "expand", lambda dtype, out=None: expanded.append(dtype) or expand(dtype, out)
    )
    # (from more rows where the AMX-BF16 tiles take the smaller products)
    first = gguf_cpu.BF16_TILE_EXPAND_ROWS if panels.bf16_tiles else gguf_cpu.EXPAND_ROWS
    assert panels.expand_rows(torch.bfloat16) == (first if native else None)
    panels(torch.randn(first, 64, dtype=torch.bfloat16))
    panels(torch.randn(first, 64))
    panels(torch.randn(first - 1, 64, dtype=torch.bfloat16))
    assert expanded == ([torch.bfloat16] if native else [])


def test_a_table_too_large_to_expand_stays_on_the_panels(monkeypatch):
    """An LM head's W^T in float32 would be a second copy of the model per call: past
    EXPAND_BYTES a prefill-sized product runs on the panels (no mm at all)."""
    monkeypatch.setattr(gguf_cpu, "EXPAND_BYTES", 64 * 64 * 4 - 1)
    codes = codes_of("Q8_0", 64, 64)
    panels = gguf_cpu.PanelsCPU(codes)
    assert not panels.expandable
    monkeypatch.setattr(torch, "mm", None)  # would raise if called
    x = torch.randn(gguf_cpu.EXPAND_ROWS + 2, 64)
    want = x.double() @ codes.dequantize().double().t()
    torch.testing.assert_close(panels(x).double(), want, rtol=1e-5, atol=1e-4)


def int8_product(x: torch.Tensor, codes) -> torch.Tensor:
    """panel_q8.cpp's arithmetic in float64: x rounded to int8 per block of 32 columns
    (scale max|x| / 127, computed in float32 as the kernel does), exact integer sums, the
    weights' scales per group and their offsets times the sum of x: x's own for codes of
    up to 4 bits, the rounded x's for wider ones (Q8_0's offset is -128 s)."""
    m, k = x.shape
    xb = x.float().view(m, k // 32, 32)
    amax = xb.abs().amax(-1, keepdim=True)
    # (a tensor divided: torch's `127.0 / t` multiplies by a rounded reciprocal)
    inv = torch.where(amax > 0, torch.full_like(amax, 127.0) / amax, torch.zeros_like(amax))
    q = torch.round(xb * inv).clamp(-127, 127).double().view(m, k)
    d = (amax / 127.0).double().view(m, k // 32)
    v = codes.v.double()  # [n, k]
    per_block = torch.einsum("mbi,nbi->mnb", q.view(m, -1, 32), v.view(v.shape[0], -1, 32))
    scaled = per_block * d[:, None, :]  # [m, n, blocks]
    group = codes.group
    per_group = scaled.view(m, v.shape[0], k // group, group // 32).sum(-1)
    if codes.bits > 4:
        rounded = (q.view(m, -1, 32) * d[..., None]).view(m, k)
        x_sums = rounded.view(m, k // group, group).sum(-1)  # [m, groups]
    else:
        x_sums = x.double().view(m, k // group, group).sum(-1)
    s, c = codes.s.double(), codes.c.double()  # [n, groups]
    return (per_group * s[None]).sum(-1) + x_sums @ c.t()


def int8_tile_for(kind: str) -> bool:
    """Whether this build has an int8 tile for the format's codes (4 bits: AVX2; wider:
    AVX-512 VNNI)."""
    bits = 4 if codes_of(kind, 16, 256).bits <= 4 else 8
    return gguf_cpu.available() and gguf_cpu.cpu_ops.ops().panel_q8_available(bits)


@pytest.mark.parametrize("kind", ["Q4_0", "Q4_1", "Q4_K", "Q5_0", "Q5_K", "Q8_0"])
def test_bf16_activations_meet_the_codes_as_int8(kind):
    """What the int8 product computes (to the order of float32 sums and one bf16 rounding),
    at every tile remainder (VNNI / AVX2 tiles of 8 / 4 rows; AMX tiles of 16 from 16
    rows, where built), and how far that is from the exact product: the activations'
    rounding, at most half a step of max|x| / 127 per block. A batch's rows equal the same
    rows multiplied one at a time, bit for bit, whichever tile ran them."""
    if not int8_tile_for(kind):
        pytest.skip(f"no int8 tile for {kind}'s codes in this build (AVX2 only: 4-bit codes)")
    n, k = 45, 512
    codes = codes_of(kind, n, k, seed=4)
    panels = gguf_cpu.PanelsCPU(codes)
    assert panels.int8_activations
    panels.bf16_tiles = False  # (from 16 rows they would take the product: tested below)
    weight = codes.dequantize().double()
    for rows in (1, 2, 3, 4, 5, 9, 16, 17, 33, gguf_cpu.EXPAND_ROWS - 1):
        x = torch.randn(rows, k, dtype=torch.bfloat16)
        x[0, :32] = 0  # a block of zeros: scale 0, no division by it
        got = panels(x)
        assert got.dtype == torch.bfloat16 and got.shape == (rows, n)
        want = int8_product(x, codes)
        bound = want.abs() * 2**-8 + 1e-4 * want.abs().max()
        assert ((got.double() - want).abs() <= bound).all(), rows
        exact = x.double() @ weight.t()
        step = x.double().view(rows, -1, 32).abs().amax(-1) / 127  # [rows, blocks]
        rounding = (step / 2) @ weight.abs().view(n, -1, 32).sum(-1).t()
        assert ((got.double() - exact).abs() <= rounding + exact.abs() * 2**-7 + 1e-3).all()
        one_at_a_time = torch.cat([panels(x[i : i + 1]) for i in range(rows)])
        assert torch.equal(got, one_at_a_time), rows


@pytest.mark.parametrize("kind", ["Q4_0", "Q4_1", "Q4_K", "Q5_0", "Q8_0"])
def test_bf16_tiles_multiply_by_the_weight_expanded_to_bf16(kind):
    """The AMX-BF16 product (where the CPU and OS have the tiles): x times the weight
    dequantized and rounded to bf16 (what the prefill path's expansion writes), float32
    sums; every remainder of the 16-row tiles and of the passes of 48 rows. From
    BF16_TILE_ROWS rows a bf16 product takes it, below that the int8 tiles."""
    panels = gguf_cpu.PanelsCPU(codes_of(kind, 45, 512, seed=5))
    if not panels.bf16_tiles:
        pytest.skip("no AMX-BF16 tiles here (CPU, OS or CADENCE_CPU_AMX=0)")
    w16 = panels.expand(torch.bfloat16).t().double()  # [45, 512]
    for rows in (1, 15, 16, 17, 33, 48, 49, 100):
        x = torch.randn(rows, 512, dtype=torch.bfloat16)
        want = x.double() @ w16.t()
        sums_bound = (x.double().abs() @ w16.abs().t()) * 2**-20  # float32 sums of 512
        out = torch.empty(rows, 45)
        panels.ops.panel_gemm_bf16(out, x, panels.q, panels.sc, panels.group, panels.bits)
        assert ((out.double() - want).abs() <= sums_bound).all(), rows
        got = panels(x)  # bf16 out: one more rounding
        assert got.dtype == torch.bfloat16
        if gguf_cpu.BF16_TILE_ROWS <= rows < gguf_cpu.BF16_TILE_EXPAND_ROWS:
            assert torch.equal(got, out.to(torch.bfloat16)), rows


def test_float32_and_16_column_groups_keep_the_float_path():
    assert not gguf_cpu.PanelsCPU(codes_of("Q6_K", 16, 256)).int8_activations  # groups of 16
    assert gguf_cpu.PanelsCPU(codes_of("Q8_0", 16, 64)).int8_activations == int8_tile_for("Q8_0")
    panels = gguf_cpu.PanelsCPU(codes_of("Q4_0", 16, 64))
    x = torch.randn(3, 64)
    want = x.double() @ codes_of("Q4_0", 16, 64).dequantize().double().t()
    torch.testing.assert_close(panels(x).double(), want, rtol=1e-5, atol=1e-5)
