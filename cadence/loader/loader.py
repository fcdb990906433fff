"""From a model name to a model with weights on the device.

resolve_model_path   (model_path.py, torch-free) None -> the default SmolLM2 GGUF; a .gguf
                     file -> its converted folder
select_quant         the weight format (cadence/quant/) a model loads in, and its tensors
load_model           config -> our class -> weights (safetensors, sharded or not, a GGUF
                     file's blocks, or dummy)
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from pathlib import Path

import torch
from torch import nn

from cadence.attention.base import AttentionBackend
from cadence.distributed.parallel_state import expert_parallel_scope, get_tp
from cadence.loader.gguf import ensure_float_weights, gguf_source
from cadence.loader.hf_config import language_view, read_config
from cadence.models.registry import resolve_model_class
from cadence.quant import mxfp4, onednn_cpu, plain_cpu
from cadence.quant.base import QuantMethod, finish_loading, quant_scope

logger = logging.getLogger(__name__)


def load_hf_config(path: str):
    """The model's config: read directly where that is safe (see hf_config.py), else by
    transformers' AutoConfig."""
    config = read_config(path)
    if config is not None:
        return config
    from transformers import AutoConfig

    try:
        return language_view(AutoConfig.from_pretrained(path))
    except (ValueError, KeyError) as e:
        raise ValueError(f"cannot read the model config in {path!r}: {e}") from e


def resolve_dtype(dtype: str, config, device: torch.device) -> torch.dtype:
    aliases = {
        "float32": torch.float32,
        "float": torch.float32,
        "fp32": torch.float32,
        "bfloat16": torch.bfloat16,
        "bf16": torch.bfloat16,
        "float16": torch.float16,
        "half": torch.float16,
        "fp16": torch.float16,
    }
    if dtype != "auto":
        return aliases[dtype]
    cfg_dtype = getattr(config, "dtype", None) or getattr(config, "torch_dtype", None)
    if isinstance(cfg_dtype, str):
        cfg_dtype = aliases.get(cfg_dtype, torch.float32)
    if cfg_dtype not in (torch.bfloat16, torch.float16):
        # As vLLM does: float32 checkpoints serve in bfloat16 unless asked otherwise
        # (on CPUs with bf16 instructions its matmuls are several times faster).
        cfg_dtype = torch.bfloat16
    if device.type == "cpu" and cfg_dtype == torch.float16:
        return torch.bfloat16  # fp16 matmuls are slow or missing on CPUs
    return cfg_dtype


def iter_safetensors(path: str) -> Iterator[tuple[str, object]]:
    """(name, slice) for every tensor of the checkpoint's files. A slice reads from disk only
    the rows or columns it is indexed with (`s[a:b]`, `s[:, a:b]`, `s[:]` for all), so a
    tensor-parallel rank reads its shard, not the whole tensor. Use each before the next."""
    from safetensors import safe_open

    files = sorted(Path(path).glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no .safetensors files in {path!r}")
    for f in files:
        with safe_open(str(f), framework="pt") as sf:
            for name in sf.keys():  # noqa: SIM118 (safe_open is no dict)
                yield name, sf.get_slice(name)


def quantization_config(config) -> dict | None:
    qcfg = getattr(config, "quantization_config", None)
    if qcfg is not None and not isinstance(qcfg, dict):
        qcfg = qcfg.to_dict()
    return qcfg or None


def select_quant(
    requested: str,
    config,
    path: str,
    dtype: torch.dtype,
    load_format: str = "auto",
    device: torch.device | None = None,
) -> tuple[QuantMethod, Iterator[tuple[str, object]] | None]:
    """(the format the model is built in, its tensors when they are not the folder's
    safetensors). `requested` is ModelConfig.quantization: auto | none | fp8 | gguf.
    Unquantized bf16 on a CPU takes the panels where oneDNN has no bf16 kernels (plain_cpu),
    and weights prepacked for oneDNN where it has (onednn_cpu)."""
    from cadence.quant.fp8_scheme import scheme_from_config
    from cadence.quant.gguf import GgufQuant

    source = gguf_source(path)
    qcfg = quantization_config(config)
    # MXFP4 experts are dequantized as they load (load_model): the model is built plain
    scheme = None if mxfp4.declared(qcfg) else scheme_from_config(qcfg)  # raises if unsupported
    if requested == "auto":
        if source is not None and load_format != "dummy":
            # Packed blocks do not split over ranks: a GGUF under TP serves expanded.
            packed = dtype != torch.float32 and get_tp().size == 1
            requested = "gguf" if packed else "none"
        else:
            requested = "fp8" if scheme is not None else "none"
    if requested == "gguf":
        if source is None:
            raise ValueError("--quantization gguf needs a .gguf model file")
        if load_format == "dummy":
            raise ValueError("--load-format dummy has no GGUF blocks: use --quantization fp8/none")
        from cadence.loader.gguf_tensors import iter_gguf

        return GgufQuant(), iter_gguf(source, config)
    if requested == "none" and scheme is not None and scheme.serialized:
        raise ValueError("this checkpoint's weights are FP8: it loads with --quantization fp8")
    if source is not None and load_format != "dummy":
        ensure_float_weights(path)  # the float path of a GGUF file: expanded once
    if requested == "fp8":
        from cadence.quant.fp8 import Fp8Quant  # (its Triton kernels: only when asked for)

        return Fp8Quant(scheme), None
    if device is not None and plain_cpu.wanted(dtype, device):
        return plain_cpu.PanelQuant(), None
    if device is not None and onednn_cpu.wanted(dtype, device):
        return onednn_cpu.PrepackedQuant(), None
    return QuantMethod(), None


def load_model(
    path: str,
    config,
    dtype: torch.dtype,
    device: torch.device,
    backend: AttentionBackend,
    max_position: int,
    load_format: str = "auto",
    seed: int = 0,
    quantization: str = "auto",
    expert_parallel: bool = False,
) -> nn.Module:
    """Build the model in the format `select_quant` picks and fill its weights: a GGUF
    file's blocks, the folder's safetensors, or random ones for `load_format="dummy"`.
    `expert_parallel`: a mixture's experts split whole across the TP ranks."""
    cls = resolve_model_class(config)
    quant, weights = select_quant(quantization, config, path, dtype, load_format, device)
    t0 = time.perf_counter()
    prev = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device), quant_scope(quant), expert_parallel_scope(expert_parallel):
            model = cls(config, backend, max_position)
    finally:
        torch.set_default_dtype(prev)
    # rotary tables stay float32; they are cast per use
    for table in model.rotary.values():
        table.cos, table.sin = table.cos.float(), table.sin.float()
    if load_format == "dummy":
        gen = torch.Generator(device=device).manual_seed(seed)
        for name, p in model.named_parameters():
            if not p.is_floating_point() or not name.endswith(("weight", "bias")):
                continue  # a format's scales keep their defaults
            if "norm" in name:
                p.data.fill_(1.0)
            else:
                p.data.uniform_(-0.02, 0.02, generator=gen)
    else:
        # copy_ casts each shard to the model's dtype (a format's method may keep its own)
        weights = weights if weights is not None else iter_safetensors(path)
        if mxfp4.declared(quantization_config(config)):
            weights = mxfp4.dequantized(weights, dtype, device)
        model.load_weights(weights)
    finish_loading(model)
    release_freed_memory()
    model.eval()
    logger.info(
        "loaded %s (%s, %s, %.2f GiB of weights) in %.1f s",
        cls.__name__,
        str(dtype).removeprefix("torch."),
        quant.describe(),
        weight_bytes(model) / 2**30,
        time.perf_counter() - t0,
    )
    return model


def release_freed_memory() -> None:
    """Hand what loading freed back to the OS. Decoding or expanding a checkpoint leaves
    hundreds of MB of freed buffers in glibc's heap, which keeps them resident (measured:
    a GGUF model's process held 187 MiB more than its weights until this ran)."""
    import contextlib
    import ctypes
    import gc

    gc.collect()
    with contextlib.suppress(OSError, AttributeError):  # not glibc: nothing to trim
        ctypes.CDLL("libc.so.6").malloc_trim(0)


def weight_bytes(model: nn.Module) -> int:
    """Bytes the model's weights hold on the device (parameters and buffers, packed or not;
    rotary tables included)."""
    tensors = list(model.parameters()) + list(model.buffers())
    return sum(t.numel() * t.element_size() for t in tensors)
