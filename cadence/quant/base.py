"""The quantization seam: how a linear layer (or the vocabulary) holds its weight and
multiplies by it.

A model builds its layers inside `quant_scope(method)`; each parallel linear layer asks
`current_method()` for its `LinearMethod` and from then on delegates to it:

    create_weights(layer, out, in)   register the parameters the format keeps
    load(layer, kind, source, ...)   copy one checkpoint tensor (or a shard of it) in
    finish(layer)                    after every tensor is in: quantize, repack, free
    apply(layer, x, bias)            y = x W^T (+ bias), in x's dtype

so models never see a format: a Llama is the same class in bf16, FP8 or GGUF. The
vocabulary (embedding and LM head) asks `current_method().embedding()`, which is plain
unless the format keeps it packed (GGUF).

Sources are anything sliceable like a tensor (a torch.Tensor or a safetensors slice);
`rows` and `cols` say which part of the checkpoint tensor this rank holds, `dest` which
rows of the layer's weight it fills (fused projections: [q; k; v] are three loads).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
import torch.nn.functional as F
from torch import nn


def shape_of(source) -> tuple[int, ...]:
    """Shape of a tensor or of a safetensors slice (which has get_shape(), not .shape)."""
    return tuple(source.shape) if hasattr(source, "shape") else tuple(source.get_shape())


_SAFETENSORS_DTYPES = {
    "F8_E4M3": torch.float8_e4m3fn,
    "BF16": torch.bfloat16,
    "F16": torch.float16,
    "F32": torch.float32,
    "F64": torch.float64,
    "I8": torch.int8,
    "U8": torch.uint8,
    "I32": torch.int32,
    "I64": torch.int64,
}


def dtype_of(source) -> torch.dtype | None:
    """The stored dtype of a tensor or a safetensors slice (None when unknown)."""
    if isinstance(source, torch.Tensor):
        return source.dtype
    if hasattr(source, "get_dtype"):
        return _SAFETENSORS_DTYPES.get(source.get_dtype())
    return getattr(source, "dtype", None)


def read(source, rows: slice, cols: slice | None) -> torch.Tensor:
    """The part [rows, cols] of a source as a tensor (a 1-D source ignores cols)."""
    if cols is None or len(shape_of(source)) == 1:
        return source[rows]
    return source[rows, cols]


class LinearMethod:
    """Plain weights in the model's dtype: y = x W^T + b through F.linear (cuBLAS, or
    oneDNN on a CPU). Formats subclass it and override what differs."""

    name = "none"

    def create_weights(self, layer: nn.Module, out_features: int, in_features: int) -> None:
        layer.weight = nn.Parameter(torch.empty(out_features, in_features), requires_grad=False)

    def load(
        self, layer: nn.Module, kind: str, source, rows: slice, cols: slice | None, dest: slice
    ) -> None:
        """Copy source[rows, cols] into the layer's `kind` (weight, bias) at rows `dest`."""
        param = getattr(layer, kind, None)
        if not isinstance(param, torch.Tensor):
            raise ValueError(f"unexpected {kind} for {type(layer).__name__}")
        param.data[dest].copy_(read(source, rows, cols))  # copy_ casts to the model's dtype

    def finish(self, layer: nn.Module) -> None:
        """Called once after every tensor is loaded (or dummy weights are drawn)."""

    def apply(self, layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        return F.linear(x, layer.weight, bias)

    def plain_weight(self, layer: nn.Module) -> torch.Tensor | None:
        """The weight as a [out, in] tensor in the activation dtype, where the layer keeps
        one (fused 16-bit kernels read it directly); None for packed formats."""
        return layer.weight


class EmbeddingMethod:
    """A plain vocabulary table [rows, hidden]: lookup and the LM head's product."""

    name = "none"

    def create_weights(self, layer: nn.Module, rows: int, hidden: int) -> None:
        layer.weight = nn.Parameter(torch.empty(rows, hidden), requires_grad=False)

    def load(self, layer: nn.Module, source, rows: slice, count: int) -> None:
        """Rows `rows` of the checkpoint's table fill the layer's first `count` rows; the
        rest (padding past the vocabulary) are zero."""
        layer.weight.data[:count].copy_(source[rows])
        layer.weight.data[count:].zero_()

    def finish(self, layer: nn.Module) -> None:
        pass

    def embed(self, layer: nn.Module, ids: torch.Tensor) -> torch.Tensor:
        return F.embedding(ids, layer.weight)

    def logits(self, layer: nn.Module, hidden: torch.Tensor) -> torch.Tensor:
        return hidden @ layer.weight.t()


class ExpertsMethod:
    """A mixture of experts' weights (cadence/models/moe.py's FusedExperts), stacked in the
    model's dtype: w13_weight [E, 2I, H] (gate rows, then up), w2_weight [E, H, I].

        create_weights(layer, experts, rows, hidden)   the stacks (rows: I, this rank's)
        store(layer, part, local, rows)                one expert's gate, up or down rows
        finish(layer)                                  after every expert is in
        forward_cpu(layer, x, ids, weights)            the block on a CPU (forward_reference)
        expert_mlp(layer, local, x)                    one expert's MLP on its rows (CPU)

    FP8 overrides `finish` to quantize the stacks (setting w13_scale / w2_scale, float32
    per expert and output row); GGUF keeps each expert's blocks instead of stacks on a CPU
    (cadence/quant/gguf_experts.py). The CUDA kernels read the stacks whatever the format."""

    name = "none"

    def create_weights(self, layer: nn.Module, experts: int, rows: int, hidden: int) -> None:
        layer.w13_weight = nn.Parameter(torch.empty(experts, 2 * rows, hidden))
        layer.w2_weight = nn.Parameter(torch.empty(experts, hidden, rows))

    def store(self, layer: nn.Module, part: tuple[str, int | None], local: int, rows) -> None:
        """Copy local expert `local`'s rows (shape-checked by the layer) of its gate
        (("w13", 0)), up (("w13", 1)) or down (("w2", None)) weight, or of those biases
        (("w13_bias", half), ("w2_bias", None))."""
        name, half = part
        stack = getattr(layer, name if name.endswith("bias") else f"{name}_weight").data
        target = stack[local]
        if half is not None:
            target = target[half * layer.local : (half + 1) * layer.local]
        target.copy_(rows)  # (copy_ casts to the model's dtype)

    def finish(self, layer: nn.Module) -> None:
        layer.w13_scale = layer.w2_scale = None

    def forward_cpu(
        self, layer: nn.Module, x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor
    ) -> torch.Tensor:
        """FusedExperts.forward off CUDA: the torch reference, a format's kernels where it
        has some."""
        return layer.forward_reference(x, ids, weights)

    def expert_mlp(self, layer: nn.Module, local: int, x: torch.Tensor) -> torch.Tensor:
        """act(x W13^T + b13) W2^T + b2 for local expert `local`, x [n, H] -> [n, H]."""
        w13, w2 = layer.w13_weight[local], layer.w2_weight[local]
        if layer.w13_scale is not None:  # a quantized stack, widened and scaled
            w13 = w13.float() * layer.w13_scale[local, :, None]
            w2 = w2.float() * layer.w2_scale[local, :, None]
        b13 = b2 = None
        if layer.w2_bias is not None:
            b13, b2 = layer.w13_bias[local], layer.w2_bias[local]
        h = layer.act(F.linear(x, w13.to(x.dtype), b13))
        return F.linear(h, w2.to(x.dtype), b2)


class QuantMethod:
    """A format: which LinearMethod, EmbeddingMethod and ExpertsMethod each layer gets. This
    base is the unquantized model."""

    name = "none"

    def linear(self) -> LinearMethod:
        return LinearMethod()

    def experts(self) -> ExpertsMethod:
        return ExpertsMethod()

    def embedding(self) -> EmbeddingMethod:
        return EmbeddingMethod()

    def describe(self) -> str:
        return self.name


_current: list[QuantMethod] = [QuantMethod()]


def current_method() -> QuantMethod:
    """The format the layers being built now take (plain outside any quant_scope)."""
    return _current[-1]


@contextlib.contextmanager
def quant_scope(method: QuantMethod) -> Iterator[None]:
    """Build layers in this format: every linear and vocabulary layer created inside asks it
    for its method."""
    _current.append(method)
    try:
        yield
    finally:
        _current.pop()


def finish_loading(model: nn.Module) -> None:
    """Let every layer's method quantize or repack what was loaded."""
    for module in model.modules():
        method = getattr(module, "quant_method", None)
        if method is not None:
            method.finish(module)
