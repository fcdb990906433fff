"""4-bit planes on a CPU, through torch's packed int4 kernel
(`aten._weight_int4pack_mm_for_cpu`: AVX-512 / AVX2, weights unpacked in registers).

The kernel computes x W^T for W[n, k] = (q - 8) * scale + zero per group of 32, 64, 128
or 256 columns, with q packed by `_convert_weight_to_int4pack_for_cpu` and
scales_and_zeros [K / g, N, 2] in the activation dtype; N must be a multiple of 16 (the
rows are padded with zeros and the padding cut off the output). A two-plane weight is
two products summed.
"""

from __future__ import annotations

import torch

from cadence.quant.gguf_blocks import Planes

GROUPS = (32, 64, 128, 256)


def supported(planes: Planes) -> bool:
    return planes.group in GROUPS and planes.q.shape[-1] % planes.group == 0


class Int4PackCPU(torch.nn.Module):
    def __init__(self, planes: Planes, dtype: torch.dtype) -> None:
        super().__init__()
        if not supported(planes):
            raise ValueError(f"the CPU int4 kernel takes groups of {GROUPS}, not {planes.group}")
        p, n, k = planes.q.shape
        n_pad = -(-n // 16) * 16
        self.out_features, self.in_features, self.group = n, k, planes.group
        self.planes = p
        for i in range(p):
            q = torch.full((n_pad, k), 8, dtype=torch.int32)  # padding rows: value 0
            q[:n] = planes.q[i].to(torch.int32)
            zero = planes.zero if i == 0 else torch.zeros_like(planes.zero)
            sz = torch.zeros((n_pad, k // planes.group, 2), dtype=torch.float32)
            sz[:n, :, 0] = planes.scale[i]
            sz[:n, :, 1] = zero
            packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q, 2)
            self.register_buffer(f"packed{i}", packed)
            self.register_buffer(f"sz{i}", sz.transpose(0, 1).contiguous().to(dtype))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = None
        for i in range(self.planes):
            sz = getattr(self, f"sz{i}")
            part = torch.ops.aten._weight_int4pack_mm_for_cpu(
                x.to(sz.dtype), getattr(self, f"packed{i}"), self.group, sz
            )
            y = part if y is None else y + part
        return y[:, : self.out_features].to(x.dtype)
