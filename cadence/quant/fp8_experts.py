"""FP8 experts (`--quantization fp8` on a 16-bit checkpoint or dummy weights): each
expert's rows quantized to e4m3 at load, a float32 scale per (expert, output row), as the
dense layers' per-channel scheme (fp8.py), so a step reads half the bytes of bf16 experts.
Where the tile table gives a decode-sized step "w8a8" tiles (on the H200: Qwen3-30B-A3B's
steps of 5-256 tokens, Mixtral-8x7B's of up to 128), the tokens and the activation are
quantized per row and the swapped Triton GEMMs multiply in FP8 (W8A8,
cadence/ops/moe_w8a8.py); the large steps it marks take CUTLASS's scaled grouped GEMM, W8A8
as well (cadence/ops/moe_grouped_mm.py); other steps widen the e4m3 tiles to the
activations' dtype in registers (W8A16, cadence/ops/fused_moe.py).
"""

from __future__ import annotations

import torch
from torch import nn

from cadence.quant import fp8_kernels as fk
from cadence.quant.base import ExpertsMethod


def quantize_experts(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Stacked weights [E, N, K] -> (e4m3 [E, N, K], float32 scale [E, N]), one expert at a
    time: beside the 16-bit stack (freed when the layer swaps it for this), one expert's
    float32 temporaries."""
    q = torch.empty(w.shape, dtype=fk.FP8, device=w.device)
    scale = torch.empty(w.shape[:2], dtype=torch.float32, device=w.device)
    for e in range(w.shape[0]):
        q[e], scale[e] = fk.quantize_weight(w[e])
    return q, scale


class Fp8ExpertsMethod(ExpertsMethod):
    name = "fp8"

    def finish(self, layer: nn.Module) -> None:
        for name in ("w13", "w2"):
            q, scale = quantize_experts(getattr(layer, f"{name}_weight").data)
            setattr(layer, f"{name}_weight", nn.Parameter(q, requires_grad=False))
            setattr(layer, f"{name}_scale", nn.Parameter(scale, requires_grad=False))
