"""Which FP8 layout a checkpoint declares (its quantization_config), read without the
FP8 kernels: the loader asks this of every model, on machines with no Triton too."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Fp8Scheme:
    serialized: bool = False  # the checkpoint's weights are e4m3 with weight_scale
    static_input: bool = False  # activations use the checkpoint's input_scale

    def describe(self) -> str:
        weights = "e4m3 checkpoint" if self.serialized else "quantized at load"
        acts = "static activation scales" if self.static_input else "per-token activations"
        return f"fp8 W8A8 ({weights}, {acts})"


def scheme_from_config(qcfg: dict | None) -> Fp8Scheme | None:
    """The FP8 scheme a checkpoint's quantization_config declares (None: no config).
    Raises ValueError for a quantization this engine does not run."""
    if not qcfg:
        return None
    method = qcfg.get("quant_method")
    if method == "fp8":
        if qcfg.get("weight_block_size"):
            raise ValueError("block-wise FP8 checkpoints (weight_block_size) are not supported")
        return Fp8Scheme(serialized=True, static_input=qcfg.get("activation_scheme") == "static")
    if method == "compressed-tensors":
        groups = list((qcfg.get("config_groups") or {}).values())
        if len(groups) != 1:
            raise ValueError("compressed-tensors: one config group is supported")
        weights, acts = groups[0].get("weights") or {}, groups[0].get("input_activations") or {}
        is_fp8 = weights.get("type") == "float" and weights.get("num_bits") == 8
        if not is_fp8 or weights.get("strategy") not in ("tensor", "channel"):
            raise ValueError(
                "compressed-tensors: only FP8 weights per tensor or per channel are supported"
            )
        if acts and (acts.get("type") != "float" or acts.get("num_bits") != 8):
            raise ValueError("compressed-tensors: only FP8 activations are supported")
        static = bool(acts) and not acts.get("dynamic", True)
        if static and acts.get("strategy") != "tensor":
            raise ValueError("compressed-tensors: static activation scales must be per tensor")
        return Fp8Scheme(serialized=True, static_input=static)
    raise ValueError(
        f"quantization method {method!r} is not supported (fp8, compressed-tensors FP8, GGUF)"
    )
