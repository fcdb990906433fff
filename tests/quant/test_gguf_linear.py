"""GGUF layers keep their blocks packed and multiply exactly as the dequantized weight would:
every format through the CPU panels (gguf_cpu.py; without the built kernels, torch's int4
kernel or the dense fallback for Q6_K's groups of 16), fused projections of mixed formats,
and the vocabulary's lookup and logits."""

import pytest
import torch
import torch.nn.functional as F
from quant_helpers import built_in
from test_gguf_blocks import random_blocks

from cadence.layers.embedding import ParallelLMHead, VocabParallelEmbedding
from cadence.layers.linear import ColumnParallelLinear, ColumnShard, RowParallelLinear
from cadence.quant import gguf_cpu
from cadence.quant.base import finish_loading
from cadence.quant.gguf import GgufQuant, GgufTensor
from cadence.quant.gguf_blocks import BLOCKS, decode
from cadence.quant.int4_cpu import Int4PackCPU


def gguf_tensor(kind: str, n: int, k: int, seed: int = 0) -> GgufTensor:
    return GgufTensor(kind, random_blocks(kind, n, k, seed), (n, k))


def build(factory, dtype=torch.float32):
    return built_in(GgufQuant(), factory, dtype)


@pytest.mark.parametrize("kind", sorted(BLOCKS))
def test_linear_matches_the_dequantized_weight(kind):
    n, k = 48, 512
    src = gguf_tensor(kind, n, k)
    layer = build(lambda: RowParallelLinear(k, n, bias=False, what="x"))
    layer.load("weight", src)
    finish_loading(layer)
    assert layer.weight is None  # nothing expanded is kept
    if gguf_cpu.available():
        expect_kernel = gguf_cpu.PanelsCPU
    else:
        expect_kernel = Int4PackCPU if kind != "Q6_K" else torch.nn.Module
    assert isinstance(layer.kernels[0], expect_kernel)
    for rows in (5, 400):  # the packed kernel; expanded once for a prefill-sized call
        x = torch.randn(rows, k)
        want = F.linear(x.double(), src.codes().dequantize().double()).float()
        got = layer(x)
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4 * want.abs().max().item())


def test_bf16_activations_agree_within_bf16_rounding():
    n, k = 64, 256
    src = gguf_tensor("Q4_1", n, k)
    layer = build(lambda: RowParallelLinear(k, n, bias=False, what="x"), torch.bfloat16)
    layer.load("weight", src)
    finish_loading(layer)
    x = torch.randn(3, k, dtype=torch.bfloat16)
    want = F.linear(x.float(), src.codes().dequantize())
    got = layer(x)
    assert got.dtype == torch.bfloat16
    assert (got.float() - want).abs().max() <= 0.02 * want.abs().max()


def test_fused_projection_of_mixed_formats_and_a_bias():
    k = 256
    kinds = ["Q4_K", "Q6_K", "Q8_0"]
    rows = [32, 16, 16]
    shards = [ColumnShard(r, 0, r) for r in rows]
    layer = build(lambda: ColumnParallelLinear(k, shards, bias=True))
    sources = [gguf_tensor(kind, r, k, seed=i) for i, (kind, r) in enumerate(zip(kinds, rows))]
    bias = torch.randn(sum(rows))
    for i, src in enumerate(sources):
        layer.load("weight", src, i)
        layer.load("bias", bias[sum(rows[:i]) : sum(rows[: i + 1])], i)
    finish_loading(layer)
    assert len(layer.kernels) == 3  # formats differ: one kernel a part
    weight = torch.cat([s.codes().dequantize() for s in sources])
    x = torch.randn(4, k)
    torch.testing.assert_close(layer(x), F.linear(x, weight, bias), rtol=1e-4, atol=1e-3)


def test_fused_projection_of_one_format_is_one_kernel():
    k = 128
    shards = [ColumnShard(32, 0, 32), ColumnShard(16, 0, 16)]
    layer = build(lambda: ColumnParallelLinear(k, shards, bias=False))
    sources = [gguf_tensor("Q4_0", 32, k, 1), gguf_tensor("Q4_0", 16, k, 2)]
    for i, src in enumerate(sources):
        layer.load("weight", src, i)
    finish_loading(layer)
    assert len(layer.kernels) == 1
    x = torch.randn(2, k)
    weight = torch.cat([s.codes().dequantize() for s in sources])
    torch.testing.assert_close(layer(x), F.linear(x, weight), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("lookup", [True, False])
def test_vocabulary_lookup_and_logits(lookup):
    vocab, hidden = 100, 64  # 100 rows: the CPU kernel pads them to 112
    src = gguf_tensor("Q8_0", vocab, hidden)
    cls = VocabParallelEmbedding if lookup else ParallelLMHead
    table = build(lambda: cls(vocab, hidden))
    table.load("weight", src)
    finish_loading(table)
    weight = src.codes().dequantize()
    if lookup:
        ids = torch.tensor([3, 99, 0, 3])
        torch.testing.assert_close(table(ids), weight[ids])
    h = torch.randn(3, hidden)
    logits = table.logits(h)
    assert logits.shape == (3, vocab)
    torch.testing.assert_close(logits, h @ weight.t(), rtol=1e-4, atol=1e-4)
    if not lookup:
        assert table.gguf_codes is None  # an LM head keeps only what the logits need


def test_a_float_tensor_in_a_gguf_model_stays_plain():
    layer = build(lambda: RowParallelLinear(64, 32, bias=False, what="x"))
    w = torch.randn(32, 64)
    layer.load("weight", w)
    finish_loading(layer)
    x = torch.randn(2, 64)
    torch.testing.assert_close(layer(x), F.linear(x, w))


def test_tensor_parallel_shards_are_refused():
    layer = build(lambda: RowParallelLinear(64, 32, bias=False, what="x"))
    src = gguf_tensor("Q4_0", 32, 64)
    with pytest.raises(ValueError, match="do not split"):  # the columns rank 0 of 2 holds
        layer.quant_method.load(layer, "weight", src, slice(0, 32), slice(0, 32), slice(0, 32))


def test_codes_decode_the_rows_a_slice_names():
    src = gguf_tensor("Q4_K", 8, 256)
    part = src[2:5]
    assert part.shape == (3, 256)
    torch.testing.assert_close(part.codes().dequantize(), src.codes().dequantize()[2:5])
    with pytest.raises(TypeError):
        src[1]
    assert decode("Q4_K", part.raw, part.shape).v.shape == (3, 256)


@pytest.mark.parametrize("n", [64, 100, 960])
def test_cpu_kernel_expands_its_packed_bytes_exactly(n):
    """The packed layout Int4PackCPU.dequantize reads is torch's (rows padded to 64)."""
    from cadence.quant.gguf_blocks import to_planes

    codes = gguf_tensor("Q8_0", n, 128).codes()  # two planes
    kernel = Int4PackCPU(to_planes(codes), torch.float32)
    torch.testing.assert_close(kernel.dequantize(), codes.dequantize(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("kind", ["Q4_1", "Q8_0"])  # one plane, two planes
def test_cpu_kernel_expansion_equals_the_torch_ops_bit_for_bit(kind, dtype):
    """The C++ expansion (cpu_ops.expand_int4) rounds where the PyTorch ops do."""
    from cadence.ops import cpu_ops
    from cadence.quant.gguf_blocks import to_planes

    if cpu_ops.ops() is None:
        pytest.skip("the CPU kernels did not build here (no C++ compiler)")
    kernel = Int4PackCPU(to_planes(gguf_tensor(kind, 100, 256).codes()), dtype)
    want = kernel.dequantize_torch()
    assert torch.equal(kernel.dequantize(), want)
    assert torch.equal(kernel.dequantize(transposed=True), want.t())


def test_prefill_sized_products_equal_the_packed_kernel():
    """Past DEQUANT_ROWS rows the product runs on the expanded weight: the same values."""
    from cadence.quant import int4_cpu
    from cadence.quant.gguf_blocks import to_planes

    kernel = Int4PackCPU(to_planes(gguf_tensor("Q4_1", 100, 256).codes()), torch.float32)
    x = torch.randn(int4_cpu.DEQUANT_ROWS + 3, 256)
    want = torch.cat([kernel(x[i : i + 8]) for i in range(0, len(x), 8)])  # packed path
    torch.testing.assert_close(kernel(x), want, rtol=1e-4, atol=1e-4)
