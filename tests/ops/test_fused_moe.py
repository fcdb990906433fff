"""The Triton mixture-of-experts kernels (cadence/ops/fused_moe.py) equal the per-expert
torch path (cadence/models/moe.py): random routings with experts that get no token and
experts that get many, one token (a decode) to many, float32 and bf16. On a CPU they run
under Triton's interpreter in a child process (TRITON_INTERPRET is read at import)."""

from __future__ import annotations

import pytest
import torch
from interpreter_helpers import check_all_under_interpreter

pytest.importorskip("triton", reason="triton is not installed")


def check_all(device: str) -> None:
    from cadence.models.moe import FusedExperts, route
    from cadence.ops import fused_moe

    torch.manual_seed(0)
    hidden, inter, num_experts = 48, 40, 8  # widths that are not tile multiples
    experts = FusedExperts(num_experts, hidden, inter).to(device)
    experts.w13_weight.data.normal_(std=0.2)
    experts.w2_weight.data.normal_(std=0.2)
    # The alignment: every pair once, each expert's run padded to the row block.
    ids = torch.tensor([[3, 1], [3, 0], [1, 3]], device=device)
    sorted_pairs, block_expert = fused_moe.align(ids, num_experts, 4)
    real = sorted_pairs[sorted_pairs < 6].tolist()
    assert sorted(real) == list(range(6))
    assert block_expert.tolist()[:3] == [0, 1, 3] and set(block_expert.tolist()[3:]) == {-1}
    cases = [(torch.float32, 1e-4), (torch.float16, 1e-2)]
    if device == "cuda":  # (the interpreter's tl.dot has no bf16)
        cases.append((torch.bfloat16, 3e-2))
    for dtype, tol in cases:
        for tokens, top_k in ((1, 2), (5, 2), (33, 3)):
            x = torch.randn(tokens, hidden, device=device, dtype=dtype)
            logits = torch.randn(tokens, num_experts, device=device)
            logits[:, 5:] -= 100.0  # experts 5-7 never chosen
            weights, ids = route(logits, top_k, renormalize=True)
            w13, w2 = experts.w13_weight.to(dtype), experts.w2_weight.to(dtype)
            ref = FusedExperts(num_experts, hidden, inter).to(device, dtype)
            ref.w13_weight.data.copy_(w13)
            ref.w2_weight.data.copy_(w2)
            want = ref.forward_reference(x, ids, weights)
            got = fused_moe.fused_experts(x, w13, w2, ids, weights)
            torch.testing.assert_close(got, want, atol=tol, rtol=tol)
    empty = fused_moe.fused_experts(x[:0], w13, w2, ids[:0], weights[:0])  # no tokens
    assert empty.shape == (0, hidden)


def test_fused_moe_under_the_interpreter():
    check_all_under_interpreter("test_fused_moe")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_fused_moe_on_cuda():
    check_all("cuda")
