"""A mixture's experts kept in GGUF blocks on a CPU (cadence/quant/gguf_experts.py): each
expert's panels stacked once, a step in one call of the kernels (moe_panels.cpp), which
must give what the torch reference gives running each chosen expert's own kernels."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from test_gguf_blocks import random_blocks

from cadence.models.moe import FusedExperts
from cadence.quant import gguf_cpu
from cadence.quant.base import finish_loading, quant_scope
from cadence.quant.gguf import GgufQuant, GgufTensor

pytestmark = pytest.mark.skipif(
    not gguf_cpu.available(), reason="the CPU kernels did not build here (no C++ compiler)"
)
E, H, INTER = 8, 128, 64


def stack(kind: str, rows: int, cols: int, seed: int) -> GgufTensor:
    raw = np.stack([random_blocks(kind, rows, cols, seed=seed + e) for e in range(E)])
    return GgufTensor(kind, raw, (E, rows, cols))


def gguf_experts(kinds=("Q4_0", "Q4_0", "Q8_0"), dtype=torch.float32) -> FusedExperts:
    prev = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with quant_scope(GgufQuant()):
            experts = FusedExperts(E, H, INTER)
    finally:
        torch.set_default_dtype(prev)
    experts.load_stacked("gate_proj", stack(kinds[0], INTER, H, 0))
    experts.load_stacked("up_proj", stack(kinds[1], INTER, H, 100))
    experts.load_stacked("down_proj", stack(kinds[2], H, INTER, 200))
    finish_loading(experts)
    return experts


def routing(tokens: int, seed: int, high: int = E):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, high, (tokens, 2), generator=g)
    ids[:, 1] = (ids[:, 0] + 1 + torch.randint(0, high - 1, (tokens,), generator=g)) % high
    weights = torch.rand(tokens, 2, generator=g)
    return ids, weights


@pytest.mark.parametrize("tokens", [1, 3, 17])
def test_one_call_equals_each_expert_on_its_own_in_float32(tokens):
    """Float activations (the exact path): the same sums in the same order, bit for bit,
    for a decode row and for batches where some experts get no token."""
    experts = gguf_experts()
    assert experts.gguf_stacks is not None and experts.w13_weight is None
    x = torch.randn(tokens, H)
    ids, weights = routing(tokens, seed=tokens)
    got = experts.quant_method.forward_cpu(experts, x, ids, weights)
    assert torch.equal(got, experts.forward_reference(x, ids, weights))


@pytest.mark.parametrize("down", ["Q8_0", "Q5_0"])
def test_bf16_rows_take_the_int8_tiles_and_one_rounding(down):
    """bf16: the same products (int8 activations where the build has them for the codes:
    a Q5_0 down keeps float activations on AVX2 while gate|up go int8); each token's sum
    is float32 and rounded once, where the reference rounds every weighted output to bf16
    before adding."""
    experts = gguf_experts(kinds=("Q4_0", "Q4_0", down), dtype=torch.bfloat16)
    assert experts.gguf_stacks is not None
    x = torch.randn(5, H, dtype=torch.bfloat16)
    ids, weights = routing(5, seed=9)
    weights = weights.to(torch.bfloat16)
    got = experts.quant_method.forward_cpu(experts, x, ids, weights)
    want = experts.forward_reference(x, ids, weights)
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(
        got.float(), want.float(), rtol=2e-2, atol=2e-2 * want.abs().max().item()
    )


def test_another_ranks_experts_add_nothing():
    """Under expert parallelism ids outside this rank's [first, first + E) are skipped."""
    experts = gguf_experts()
    experts.first_expert = 4  # (as rank 1 of 2 would hold experts 4..11 of 16)
    x = torch.randn(6, H)
    ids, weights = routing(6, seed=3, high=16)
    got = experts.quant_method.forward_cpu(experts, x, ids, weights)
    assert torch.equal(got, experts.forward_reference(x, ids, weights))
    none_here = torch.full((2, 2), 15)
    assert torch.equal(experts.quant_method.forward_cpu(experts, x[:2], none_here, weights[:2]),
                       torch.zeros(2, H))  # fmt: skip


def test_stacked_panels_are_the_experts_own_not_a_copy():
    experts = gguf_experts()
    q13 = experts.gguf_stacks[0]
    kernel = experts.gguf_experts[3].w13[0]
    assert kernel.q.untyped_storage().data_ptr() == q13.untyped_storage().data_ptr()
    assert torch.equal(kernel.q, q13[3])


def test_experts_whose_sides_differ_in_layout_keep_the_reference():
    """Gate Q8_0 and up Q4_0 cannot share one panels kernel: each expert keeps two, no
    stacks, and the torch reference runs them."""
    experts = gguf_experts(kinds=("Q8_0", "Q4_0", "Q8_0"))
    assert experts.gguf_stacks is None and len(experts.gguf_experts[0].w13) == 2
    x = torch.randn(4, H)
    ids, weights = routing(4, seed=1)
    got = experts.quant_method.forward_cpu(experts, x, ids, weights)
    assert torch.equal(got, experts.forward_reference(x, ids, weights))
