"""FP8 experts (`--quantization fp8` on a 16-bit checkpoint or dummy weights): each
expert's rows quantized to e4m3 at load, a float32 scale per (expert, output row), as the
dense layers' per-channel scheme (fp8.py). Decode-sized steps' grouped GEMMs widen the e4m3
tiles to the activations' dtype in registers (W8A16, cadence/ops/fused_moe.py), so a step
reads half the bytes of bf16 experts; the large steps the tile table marks take CUTLASS's
scaled grouped GEMM with the activations quantized per row too (W8A8,
cadence/ops/moe_grouped_mm.py).
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
