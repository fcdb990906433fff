"""Plain bf16 weights in the CPU panels (cadence/quant/plain_cpu.py, panel_gemm.cpp's 16-bit
panels): chosen only where oneDNN has no bf16 GEMM; a product equals x @ W.T of the bf16
weight at every batch size the tiles cut (and the prefill path), the vector tile (AVX-512 or AVX2, as built) equals the
portable loop, and the vocabulary's one table serves lookups and logits."""

import pytest
import torch
import torch.nn.functional as F
from quant_helpers import built_in

from cadence.layers.embedding import VocabParallelEmbedding
from cadence.layers.linear import ColumnParallelLinear, ColumnShard
from cadence.loader.loader import select_quant
from cadence.quant import gguf_cpu, plain_cpu
from cadence.quant.base import QuantMethod, finish_loading

pytestmark = pytest.mark.skipif(
    not gguf_cpu.available(), reason="the CPU kernels did not build here (no C++ compiler)"
)


def bf16_weight(n: int, k: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(n, k, generator=torch.Generator().manual_seed(seed)).bfloat16()


def test_a_product_is_x_times_the_bf16_weight_at_every_batch_size():
    n, k = 37, 96  # 37 rows: three panels, the last cut short
    weight = bf16_weight(n, k)
    panels = gguf_cpu.PanelsCPU.from_plain(weight)
    assert panels.bits == 16 and panels.q.dtype == torch.uint8
    for rows in (1, 2, 3, 4, 5, 6, 7, 13, gguf_cpu.EXPAND_ROWS + 1):
        x = torch.randn(rows, k)
        want = (x.double() @ weight.double().t()).float()
        torch.testing.assert_close(panels(x), want, rtol=1e-5, atol=1e-5 * want.abs().max())
        got16 = panels(x.bfloat16())  # float32 sums, one rounding to bf16
        want16 = x.bfloat16().double() @ weight.double().t()
        assert got16.dtype == torch.bfloat16
        assert ((got16.double() - want16).abs() <= want16.abs() * 2**-7 + 1e-3).all()


def test_the_vector_tile_equals_the_portable_loop():
    weight = bf16_weight(50, 64)
    panels = gguf_cpu.PanelsCPU.from_plain(weight)
    for rows in (1, 4, 6, 11, 12, 25):  # AVX2 tiles of 6 rows, AVX-512 of 12
        x = torch.randn(rows, 64)
        fast, portable = torch.empty(rows, 50), torch.empty(rows, 50)
        panels.ops.panel_gemm(fast, x, panels.q, panels.sc, panels.group, 16, False)
        panels.ops.panel_gemm(portable, x, panels.q, panels.sc, panels.group, 16, True)
        # the tile's sums are fused multiply-adds (one rounding), the loop's two roundings
        scale = portable.abs().max().item()
        torch.testing.assert_close(fast, portable, rtol=1e-5, atol=1e-5 * scale)


def test_lookups_and_the_expansion_are_the_weight_itself():
    weight = bf16_weight(40, 32)
    panels = gguf_cpu.PanelsCPU.from_plain(weight)
    ids = torch.tensor([[0, 39], [17, 17]])
    assert torch.equal(panels.rows(ids, torch.bfloat16), weight[ids])
    assert torch.equal(panels.expand(torch.float32), weight.float().t())
    with pytest.raises(RuntimeError, match="outside the table"):
        panels.rows(torch.tensor([40]), torch.bfloat16)


def build(factory):
    return built_in(plain_cpu.PanelQuant(), factory, torch.bfloat16)


def test_a_fused_projection_loads_shard_by_shard_then_packs():
    q, kv, k = torch.randn(32, 48).bfloat16(), torch.randn(16, 48).bfloat16(), 48
    layer = build(
        lambda: ColumnParallelLinear(
            k, [ColumnShard.split(32, "q"), ColumnShard.split(16, "kv")], bias=True
        )
    )
    layer.load("weight", q, 0)
    layer.load("weight", kv, 1)
    layer.bias.data.copy_(torch.arange(48, dtype=torch.bfloat16))
    finish_loading(layer)
    assert layer.weight is None and layer.quant_method.plain_weight(layer) is None
    x = torch.randn(3, k, dtype=torch.bfloat16)
    want = F.linear(x.float(), torch.cat([q, kv]).float(), layer.bias.float())
    torch.testing.assert_close(layer(x).float(), want, rtol=2e-2, atol=2e-2)


def test_the_vocabulary_table_serves_lookups_and_logits():
    table = bf16_weight(100, 32)
    layer = build(lambda: VocabParallelEmbedding(100, 32))
    layer.load("weight", table)
    finish_loading(layer)
    assert layer.weight is None
    ids = torch.tensor([3, 99, 0])
    assert torch.equal(layer(ids), table[ids])
    hidden = torch.randn(2, 32, dtype=torch.bfloat16)
    want = hidden.double() @ table.double().t()
    got = layer.logits(hidden)
    assert got.shape[-1] >= 100
    torch.testing.assert_close(got[:, :100].double(), want, rtol=2e-2, atol=2e-2)


def test_the_panels_are_chosen_only_where_onednn_has_no_bf16_gemm(tmp_path):
    no_onednn_bf16 = not torch.ops.mkldnn._is_mkldnn_bf16_supported()
    assert plain_cpu.wanted(torch.bfloat16, torch.device("cpu")) == no_onednn_bf16
    assert not plain_cpu.wanted(torch.float32, torch.device("cpu"))  # float32 stays exact
    assert not plain_cpu.wanted(torch.bfloat16, torch.device("meta"))
    config = type("Config", (), {"quantization_config": None})()
    quant, _ = select_quant("none", config, str(tmp_path), torch.bfloat16, "dummy", "cpu")
    assert isinstance(quant, plain_cpu.PanelQuant) == no_onednn_bf16
    quant, _ = select_quant("none", config, str(tmp_path), torch.float32, "dummy", "cpu")
    assert type(quant) is QuantMethod
