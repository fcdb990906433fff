"""A mixture's experts from a GGUF file (llama.cpp's `ffn_gate_exps` / `ffn_up_exps` /
`ffn_down_exps` stacks, or a legacy file's experts one by one), kept in the file's blocks.

    CPU    each expert keeps its own kernels (gguf_packed.kernel: the panels of
           gguf_cpu.py where built): [gate; up] in one product when their formats agree,
           down in another. Where every expert has one panels kernel a side in one
           layout, the layer stacks them ([E, ...]) and a step is one call of
           moe_panels.cpp (grouping, both products of every chosen expert, SiLU-and-mul,
           the weighted sum); otherwise the torch reference runs each chosen expert's
           kernels (FusedExperts.forward_reference). Either way a token reads the blocks
           of its k experts and no expert is expanded: Qwen3-30B-A3B in Q4_K_M stays
           ~17 GiB.
    CUDA   the blocks are expanded into the model's dtype at load, into the stacks the
           Triton grouped GEMMs read (the GPU path serves the safetensors checkpoint
           better: this keeps a GGUF file servable there).

Experts with biases or GPT-OSS's clamped gate are refused: their GGUF layout is not read
yet.
"""

from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor

import torch
from torch import nn

from cadence.quant import gguf_cpu
from cadence.quant.base import ExpertsMethod
from cadence.quant.gguf_blocks import Codes
from cadence.quant.gguf_packed import GgufTensor, kernels_for

logger = logging.getLogger(__name__)


class ExpertKernels(nn.Module):
    """One expert's products: [gate; up] (one module, or one per part to concatenate) and
    down."""

    def __init__(self, w13: list[nn.Module], w2: list[nn.Module]) -> None:
        super().__init__()
        self.w13 = nn.ModuleList(w13)
        self.w2 = nn.ModuleList(w2)
        # One panels kernel a side: the layer may stack them for one call a step.
        sides = (w13, w2)
        self.panels = all(len(s) == 1 and isinstance(s[0], gguf_cpu.PanelsCPU) for s in sides)

    def forward(self, x: torch.Tensor, act: nn.Module) -> torch.Tensor:
        h = self.w13[0](x) if len(self.w13) == 1 else torch.cat([k(x) for k in self.w13], -1)
        h = act(h)
        return self.w2[0](h) if len(self.w2) == 1 else torch.cat([k(h) for k in self.w2], -1)


class GgufExpertsMethod(ExpertsMethod):
    name = "gguf"

    def create_weights(self, layer: nn.Module, experts: int, rows: int, hidden: int) -> None:
        if layer.w2_bias is not None or layer.clamped_swiglu is not None:
            raise NotImplementedError(
                "GGUF experts with biases or a clamped gate (GPT-OSS) are not supported yet: "
                "serve the safetensors checkpoint"
            )
        layer.w13_weight = layer.w2_weight = None  # (stacks only on CUDA, made at finish)
        layer.gguf_parts = {}  # (name, half, local expert) -> GgufTensor or float tensor
        layer.gguf_device = torch.get_default_device()
        layer.gguf_dtype = torch.get_default_dtype()

    def store(self, layer: nn.Module, part: tuple[str, int | None], local: int, rows) -> None:
        name, half = part
        layer.gguf_parts[(name, half, local)] = rows  # (decoded in finish, in parallel)

    def finish(self, layer: nn.Module) -> None:
        layer.w13_scale = layer.w2_scale = None
        parts, device, dtype = layer.gguf_parts, layer.gguf_device, layer.gguf_dtype
        del layer.gguf_parts
        if device.type == "cuda":
            self._expand(layer, parts, device, dtype)
            return

        def kernels(e: int) -> ExpertKernels:
            gate, up, down = (
                _decoded(parts[(*p, e)]) for p in (("w13", 0), ("w13", 1), ("w2", None))
            )
            return ExpertKernels(
                kernels_for([gate, up], dtype, device), kernels_for([down], dtype, device)
            )

        # The experts decode and pack in threads: numpy's and torch's array work releases
        # the GIL, and decoding was most of a large file's load.
        with ThreadPoolExecutor(max_workers=max(1, torch.get_num_threads())) as pool:
            layer.gguf_experts = nn.ModuleList(pool.map(kernels, range(layer.num_local)))
        layer.__dict__["gguf_stacks"] = _stack(layer.gguf_experts)
        first = layer.gguf_experts[0]
        layer.__dict__["gguf_first"] = (first.w13[0], first.w2[0])  # (read each step)

    @staticmethod
    def _expand(layer: nn.Module, parts: dict, device: torch.device, dtype: torch.dtype) -> None:
        """The stacks the CUDA kernels read, in `dtype`, one expert's blocks at a time."""
        logger.info("GGUF experts: expanded to %s on %s at load", dtype, device)
        stacks = {
            "w13": torch.empty(layer.num_local, 2 * layer.local, layer.hidden, dtype=dtype,
                               device=device),
            "w2": torch.empty(layer.num_local, layer.hidden, layer.local, dtype=dtype,
                              device=device),
        }  # fmt: skip
        for (name, half, e), part in parts.items():
            weight = _decoded(part)
            weight = weight.dequantize() if isinstance(weight, Codes) else weight
            target = stacks[name][e]
            if half is not None:
                target = target[half * layer.local : (half + 1) * layer.local]
            target.copy_(weight)
        layer.w13_weight = nn.Parameter(stacks["w13"], requires_grad=False)
        layer.w2_weight = nn.Parameter(stacks["w2"], requires_grad=False)
        layer.__dict__["gguf_stacks"] = None  # (the dtype's stacks serve the reference)

    def expert_mlp(self, layer: nn.Module, local: int, x: torch.Tensor) -> torch.Tensor:
        if "gguf_experts" not in layer._modules:  # expanded into stacks (CUDA)
            return super().expert_mlp(layer, local, x)
        return layer.gguf_experts[local](x, layer.act)

    def forward_cpu(self, layer, x, ids, weights):
        """The whole block in one call of the CPU kernels (moe_panels.cpp) where every
        expert's panels are stacked and each expert's rows take the register tiles;
        otherwise the torch reference, one expert's kernels at a time."""
        stacks = layer.gguf_stacks
        if stacks is None or x.dtype not in _DTYPES:
            return super().forward_cpu(layer, x, ids, weights)
        gate_up, down = layer.gguf_first
        # An expert's rows number 1 to T; the kernels change paths at 16 rows (AMX-BF16
        # tiles) and further up (expansion): every size must take the register tiles.
        rows = [x[:n] for n in {1, x.shape[0], *((16,) if x.shape[0] > 16 else ())}]
        int8 = [{k.register_tiles(r) for r in rows} for k in (gate_up, down)]
        if any(len(paths) != 1 or None in paths for paths in int8):
            return super().forward_cpu(layer, x, ids, weights)
        (int8_13,), (int8_2,) = int8
        return gate_up.ops.moe_panels(
            x.contiguous(), ids.long(), weights, *stacks, layer.first_expert, layer.local,
            gate_up.group, gate_up.bits, down.group, down.bits, int8_13, int8_2,
        )  # fmt: skip


_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def _decoded(part: GgufTensor | torch.Tensor) -> Codes | torch.Tensor:
    """A stored expert weight as Codes (blocks) or its float tensor (a float file)."""
    return part.codes() if isinstance(part, GgufTensor) else part


def _stack(experts: nn.ModuleList) -> tuple[torch.Tensor, ...] | None:
    """(q13, sc13, q2, sc2): every expert's [gate; up] and down panels stacked [E, ...],
    for moe_panels.cpp, where each expert has one panels kernel a side and every expert's
    side has one layout; each kernel's own q / sc become views of the stacks (no second
    copy). None otherwise."""
    if not all(k.panels for k in experts):
        return None
    stacks = []
    for side in ("w13", "w2"):
        kernels = [getattr(k, side)[0] for k in experts]
        first = kernels[0]
        layout = (first.group, first.bits, first.q.shape, first.sc.shape, first.sc.dtype)
        if any((k.group, k.bits, k.q.shape, k.sc.shape, k.sc.dtype) != layout for k in kernels):
            return None
        for name in ("q", "sc"):
            stacked = torch.stack([getattr(k, name) for k in kernels])
            for e, kernel in enumerate(kernels):
                setattr(kernel, name, stacked[e])  # (a registered buffer: a view now)
            stacks.append(stacked)
    return tuple(stacks)
