"""MXFP4 checkpoints (GPT-OSS's released weights), dequantized as they load.

Their experts are stored as `<name>_blocks`, uint8 [..., rows, cols / 32, 16] (two e2m1
values a byte, the low nibble first), and `<name>_scales`, uint8 [..., rows, cols / 32]
(a power-of-two exponent biased by 127, one per 32 values); every other weight is plain
bf16 (config.json's quantization_config: `{"quant_method": "mxfp4", ...}`). The pairs
become `<name>` in the model's dtype, in transformers' dense layout for the family
(GPT-OSS: [E, in, out], the transpose of the stored rows), read one expert at a time, so
the model loads them as a bf16 checkpoint's; under `--quantization fp8` the experts are
then quantized per row as any 16-bit checkpoint's are.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import torch

from cadence.quant.base import shape_of

# e2m1: sign, 2 exponent bits, 1 mantissa bit, by the nibble's value
E2M1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)
SUFFIXES = ("_blocks", "_scales")


def declared(qcfg: dict | None) -> bool:
    """Whether a checkpoint's quantization_config says MXFP4."""
    return bool(qcfg) and qcfg.get("quant_method") == "mxfp4"


def dequantize(blocks: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """[..., rows, cols] in `dtype` from MXFP4 blocks [..., rows, cols / 32, 16] and scales
    [..., rows, cols / 32], on the blocks' device, one leading slice (expert) at a time so
    the float32 temporaries stay one expert's."""
    if blocks.dtype != torch.uint8 or scales.dtype != torch.uint8:
        raise ValueError(f"MXFP4 blocks and scales are uint8, got {blocks.dtype}, {scales.dtype}")
    if blocks.shape[:-1] != scales.shape or blocks.shape[-1] != 16:
        raise ValueError(
            f"MXFP4 blocks {tuple(blocks.shape)} do not fit scales {tuple(scales.shape)}"
        )
    *lead, rows, groups, _ = blocks.shape
    lut = torch.tensor(E2M1, dtype=torch.float32, device=blocks.device)
    out = torch.empty((*lead, rows, groups * 32), dtype=dtype, device=blocks.device)
    flat_blocks = blocks.reshape(-1, rows, groups, 16)
    flat_scales = scales.reshape(-1, rows, groups)
    flat_out = out.view(-1, rows, groups, 32)
    for i in range(flat_blocks.shape[0]):
        b = flat_blocks[i].int()
        values = torch.stack((lut[b & 0xF], lut[b >> 4]), dim=-1).flatten(-2)  # lo, hi
        exponent = flat_scales[i].float() - 127.0
        flat_out[i] = values * torch.exp2(exponent)[..., None]
    return out


class Dequantized:
    """One stacked MXFP4 expert weight, `[E, cols, rows]` (transformers' dense layout for
    GPT-OSS), dequantized one expert at a time as it is indexed (`w[e]`, `w[e, a:b]`,
    `w[e, :, a:b]`): a rank reads and widens only its own experts, and the temporaries
    stay one expert's. `blocks` and `scales` may be tensors or safetensors slices."""

    def __init__(self, blocks, scales, dtype: torch.dtype, device: torch.device) -> None:
        shape = shape_of(blocks)
        if len(shape) != 4 or shape_of(scales) != shape[:-1] or shape[-1] != 16:
            raise ValueError(
                f"MXFP4 blocks {shape} and scales {shape_of(scales)}: only stacked experts "
                "[E, rows, cols / 32, 16] are supported"
            )
        self.blocks, self.scales, self.dtype, self.device = blocks, scales, dtype, device
        self.shape = (shape[0], shape[2] * 32, shape[1])

    def __getitem__(self, index):
        index = index if isinstance(index, tuple) else (index,)
        expert, rest = index[0], index[1:]
        if not isinstance(expert, int):
            raise TypeError("an MXFP4 weight is read one expert at a time")
        blocks, scales = (
            torch.as_tensor(t[expert]).to(self.device) for t in (self.blocks, self.scales)
        )
        return dequantize(blocks, scales, self.dtype).t()[rest]


def dequantized(
    weights: Iterable[tuple[str, object]], dtype: torch.dtype, device: torch.device
) -> Iterator[tuple[str, object]]:
    """The checkpoint's (name, tensor) pairs with each MXFP4 pair of `<name>_blocks` and
    `<name>_scales` replaced by `<name>`, a `Dequantized` view on `device`; other tensors
    pass through. Raises where a pair is incomplete. (A pair split across shard files is
    held until both arrive: safetensors slices stay readable after their file closes.)"""
    pending: dict[str, dict[str, object]] = {}
    for name, source in weights:
        suffix = next((s for s in SUFFIXES if name.endswith(s)), None)
        if suffix is None:
            yield name, source
            continue
        base = name.removesuffix(suffix)
        parts = pending.setdefault(base, {})
        parts[suffix] = source
        if len(parts) < 2:
            continue
        del pending[base]
        yield base, Dequantized(parts["_blocks"], parts["_scales"], dtype, device)
    if pending:
        raise ValueError(f"MXFP4 weights lack their blocks or scales: {sorted(pending)[:3]}")
