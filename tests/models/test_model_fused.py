"""models/fused.py's batch-1 seams off the GPU: each falls back to the unfused modules, so
a CPU model computes what it did before. (The fused kernels themselves are checked against
these modules in tests/ops/test_fused.py, under Triton's interpreter and on CUDA.)"""

from __future__ import annotations

from types import SimpleNamespace

import torch

from cadence.layers.norm import RMSNorm
from cadence.models.fused import norm_router
from cadence.models.moe import MoEOptions, SparseMoE


def test_norm_router_off_the_gpu_is_the_norm_and_leaves_routing_to_the_block():
    torch.manual_seed(0)
    norm = RMSNorm(32, 1e-6)
    norm.weight.data.uniform_(0.5, 1.5)
    moe = SparseMoE(SimpleNamespace(hidden_size=32), MoEOptions(4, 2, 16, renormalize=True))
    for p in moe.parameters():
        p.data.normal_()
    x, residual = torch.randn(1, 32), torch.randn(1, 32)
    logits, normed, summed = norm_router(x, residual, norm, moe.gate)
    want, want_sum = norm(x, residual)
    assert logits is None
    assert torch.equal(normed, want) and torch.equal(summed, want_sum)
    # A block handed its router's logits computes what it computes routing itself.
    torch.testing.assert_close(moe(normed, moe.gate(normed)), moe(normed), atol=0, rtol=0)
