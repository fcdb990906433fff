"""Plain bf16 weights prepacked for oneDNN (cadence/quant/onednn_cpu.py): chosen only for
bf16 on a CPU whose oneDNN has bf16 GEMMs (the panels serve the others), and a layer's
products equal F.linear on its plain weight bit for bit at every batch size, bias and
fused shards included, with the plain weight gone after packing; an untied LM head is
packed too, a tied vocabulary table (lookups and logits) stays plain."""

import pytest
import torch
import torch.nn.functional as F
from quant_helpers import built_in

from cadence.layers.embedding import ParallelLMHead, VocabParallelEmbedding
from cadence.layers.linear import ColumnParallelLinear, ColumnShard, RowParallelLinear
from cadence.loader.loader import select_quant
from cadence.quant import gguf_cpu, onednn_cpu
from cadence.quant.base import QuantMethod, finish_loading

CPU = torch.device("cpu")
needs_packing = pytest.mark.skipif(
    not onednn_cpu.wanted(torch.bfloat16, CPU),
    reason="oneDNN has no bf16 GEMM on this CPU: bf16 runs on the panels (test_plain_cpu.py)",
)


def build(factory):
    return built_in(onednn_cpu.PrepackedQuant(), factory, torch.bfloat16)


def test_prepacking_is_chosen_only_for_bf16_where_onednn_has_a_bf16_gemm(tmp_path, monkeypatch):
    native = gguf_cpu.native_16bit(torch.bfloat16)
    assert onednn_cpu.wanted(torch.bfloat16, CPU) == native
    assert not onednn_cpu.wanted(torch.float32, CPU)  # float32 stays on F.linear: exact
    assert not onednn_cpu.wanted(torch.bfloat16, torch.device("meta"))
    config = type("Config", (), {"quantization_config": None})()
    quant, _ = select_quant("none", config, str(tmp_path), torch.bfloat16, "dummy", "cpu")
    assert isinstance(quant, onednn_cpu.PrepackedQuant) == native
    quant, _ = select_quant("none", config, str(tmp_path), torch.float32, "dummy", "cpu")
    assert type(quant) is QuantMethod
    monkeypatch.setenv("CADENCE_CPU_PREPACK", "0")
    assert not onednn_cpu.wanted(torch.bfloat16, CPU)


@needs_packing
def test_a_fused_projection_with_bias_equals_f_linear_at_every_batch_size():
    g = torch.Generator().manual_seed(0)
    q, kv, k = torch.randn(64, 96, generator=g), torch.randn(32, 96, generator=g), 96
    bias = torch.randn(96, generator=g).bfloat16()
    layer = build(
        lambda: ColumnParallelLinear(
            k, [ColumnShard.split(64, "q"), ColumnShard.split(32, "kv")], bias=True
        )
    )
    layer.load("weight", q, 0)
    layer.load("weight", kv, 1)
    layer.bias.data.copy_(bias)
    finish_loading(layer)
    assert layer.weight is None and layer.quant_method.plain_weight(layer) is None
    weight = torch.cat([q, kv]).bfloat16()
    for rows in (1, 3, 32, 100, 513):  # decodes to a prefill chunk
        x = torch.randn(rows, k, generator=g).bfloat16()
        assert torch.equal(layer(x), F.linear(x, weight, bias))
    x = torch.randn(2, 5, k, generator=g).bfloat16()  # leading dims kept
    assert torch.equal(layer(x), F.linear(x, weight, bias))


@needs_packing
def test_a_row_parallel_layer_without_bias_takes_strided_inputs():
    g = torch.Generator().manual_seed(1)
    weight = torch.randn(48, 160, generator=g).bfloat16()
    layer = build(lambda: RowParallelLinear(160, 48, bias=False, what="o_proj"))
    layer.load("weight", weight)
    finish_loading(layer)
    x = torch.randn(7, 320, generator=g).bfloat16()[:, ::2]  # a view, not contiguous
    assert torch.equal(layer(x), F.linear(x, weight))


@needs_packing
def test_an_untied_lm_head_is_packed_and_a_tied_table_stays_plain():
    g = torch.Generator().manual_seed(2)
    table = torch.randn(100, 64, generator=g).bfloat16()
    hidden = torch.randn(3, 64, generator=g).bfloat16()
    head = build(lambda: ParallelLMHead(100, 64))
    head.load("weight", table)
    finish_loading(head)
    assert head.weight is None
    assert torch.equal(head(hidden)[:, :100], F.linear(hidden, table))
    tied = build(lambda: VocabParallelEmbedding(100, 64))  # lookups and logits from one table
    tied.load("weight", table)
    finish_loading(tied)
    assert torch.equal(tied(torch.tensor([7, 99])), table[[7, 99]])
    torch.testing.assert_close(tied.logits(hidden)[:, :100], F.linear(hidden, table))
