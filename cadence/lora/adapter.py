"""Reading a PEFT LoRA folder: `adapter_config.json` and `adapter_model.safetensors`.

What a checkpoint holds, per adapted projection `P` of decoder layer `i`:

    ...layers.{i}.self_attn.q_proj.lora_A.weight   [r, in]    (A: in -> r)
    ...layers.{i}.self_attn.q_proj.lora_B.weight   [out, r]   (B: r -> out)

and the output gains scale * B (A x), scale = lora_alpha / r (rsLoRA: lora_alpha / sqrt(r));
`rank_pattern` / `alpha_pattern` override r and alpha for the modules they name. What the
engine cannot apply is refused here, naming why (AdapterError, a ValueError): DoRA, LoRA
biases, adapters on the embeddings or the LM head, whole modules saved alongside
(`modules_to_save`), a rank above --max-lora-rank, pickled `.bin` weights (never unpickled).
"""

from __future__ import annotations

import json
import math
import os
import re
from dataclasses import dataclass

import torch
from safetensors import safe_open

CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"

# `<prefix>layers.<i>.<module path>.lora_<A|B>[.<adapter name>].weight`
_KEY = re.compile(r"(?:^|\.)layers\.(\d+)\.([\w.]+?)\.lora_([AB])(?:\.\w+)?\.weight$")


class AdapterError(ValueError):
    """An adapter this engine cannot serve; the message says why."""


@dataclass(frozen=True)
class AdapterSpec:
    """What the folder says, without its tensors: enough to accept or refuse it."""

    path: str
    rank: int  # the largest rank of any module
    modules: dict[tuple[int, str], tuple[int, float]]  # (layer, module) -> (rank, scale)


@dataclass
class Adapter:
    """The tensors, on the CPU in their stored dtype: (layer, module path inside the
    layer, e.g. "self_attn.q_proj") -> (A [r, in], B [out, r], scale)."""

    spec: AdapterSpec
    modules: dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor, float]]


def inspect_adapter(path: str, max_rank: int) -> AdapterSpec:
    """Check an adapter folder from its config and the safetensors header (no tensor is
    read). Raises AdapterError naming what is wrong."""
    config = _read_config(path)
    weights = os.path.join(path, WEIGHTS_FILE)
    if not os.path.isfile(weights):
        if os.path.isfile(os.path.join(path, "adapter_model.bin")):
            raise AdapterError(
                f"{path}: adapter_model.bin is a pickle, which this server never loads; save "
                "the adapter as safetensors (PEFT's default)"
            )
        raise AdapterError(f"{path}: no {WEIGHTS_FILE}")
    try:
        with safe_open(weights, framework="pt") as f:
            shapes = {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}  # noqa: SIM118
    except Exception as e:  # a truncated or foreign file: safetensors' own error types
        raise AdapterError(f"{path}: {WEIGHTS_FILE} is not a readable safetensors file") from e
    return _spec(path, config, shapes, max_rank)


def load_adapter(path: str, max_rank: int) -> Adapter:
    """inspect_adapter, then the tensors themselves (on the CPU)."""
    spec = inspect_adapter(path, max_rank)
    pairs: dict[tuple[int, str], dict[str, torch.Tensor]] = {}
    with safe_open(os.path.join(path, WEIGHTS_FILE), framework="pt") as f:
        for key in f.keys():  # noqa: SIM118 (safe_open has no __iter__)
            m = _KEY.search(key)
            pairs.setdefault((int(m.group(1)), m.group(2)), {})[m.group(3)] = f.get_tensor(key)
    modules = {where: (ab["A"], ab["B"], spec.modules[where][1]) for where, ab in pairs.items()}
    return Adapter(spec, modules)


def _read_config(path: str) -> dict:
    if not os.path.isdir(path):
        raise AdapterError(f"{path!r} is not a folder holding a PEFT adapter")
    try:
        with open(os.path.join(path, CONFIG_FILE)) as f:
            config = json.load(f)
    except FileNotFoundError:
        raise AdapterError(f"{path}: no {CONFIG_FILE}") from None
    except (OSError, ValueError) as e:
        raise AdapterError(f"{path}: {CONFIG_FILE} is not readable JSON ({e})") from None
    if not isinstance(config, dict):
        raise AdapterError(f"{path}: {CONFIG_FILE} is not a JSON object")
    kind = config.get("peft_type", "LORA")
    if str(kind).upper() != "LORA":
        raise AdapterError(f"{path}: a {kind} adapter; only LoRA adapters are served")
    for key, what in (("use_dora", "DoRA"), ("fan_in_fan_out", "fan_in_fan_out (Conv1D)")):
        if config.get(key):
            raise AdapterError(f"{path}: {what} adapters are not supported")
    if config.get("bias", "none") != "none":
        raise AdapterError(f"{path}: LoRA biases (bias={config['bias']!r}) are not supported")
    return config


def _spec(path: str, config: dict, shapes: dict[str, tuple], max_rank: int) -> AdapterSpec:
    found: dict[tuple[int, str], dict[str, tuple]] = {}
    for key, shape in shapes.items():
        m = _KEY.search(key)
        if m is None:
            if "lora_embedding" in key or "embed_tokens" in key or "lm_head" in key:
                raise AdapterError(
                    f"{path}: adapters on the embeddings or the LM head are not supported "
                    f"yet ({key})"
                )
            raise AdapterError(
                f"{path}: {key} is not a LoRA weight of a decoder layer (whole modules saved "
                "with the adapter, modules_to_save, are not supported)"
            )
        found.setdefault((int(m.group(1)), m.group(2)), {})[m.group(3)] = shape
    if not found:
        raise AdapterError(f"{path}: {WEIGHTS_FILE} holds no LoRA weights")
    alpha = float(config.get("lora_alpha", config.get("r", 8)))
    rs = bool(config.get("use_rslora", False))
    modules: dict[tuple[int, str], tuple[int, float]] = {}
    for (layer, module), ab in found.items():
        if set(ab) != {"A", "B"}:
            raise AdapterError(f"{path}: layer {layer} {module} lacks its lora_A or lora_B")
        if len(ab["A"]) != 2 or len(ab["B"]) != 2 or ab["A"][0] != ab["B"][1]:
            raise AdapterError(
                f"{path}: layer {layer} {module}: A of shape {ab['A']} and B of shape "
                f"{ab['B']} do not pair"
            )
        r = ab["A"][0]
        if r > max_rank:
            raise AdapterError(
                f"{path}: rank {r} is above this server's --max-lora-rank {max_rank}"
            )
        name = f"layers.{layer}.{module}"
        r_cfg = _pattern(config.get("rank_pattern"), name, config.get("r", r))
        a = float(_pattern(config.get("alpha_pattern"), name, alpha))
        if int(r_cfg) != r:
            raise AdapterError(f"{path}: {name} has rank {r}, its config says {r_cfg}")
        modules[(layer, module)] = (r, a / math.sqrt(r) if rs else a / r)
    return AdapterSpec(path, max(r for r, _ in modules.values()), modules)


_REGEX = re.compile(r"[\\^$*+?{}\[\]|()]")


def _pattern(patterns: dict | None, name: str, default):
    """PEFT's per-module override: the value of the first key that names the module
    (`name`: layers.{i}.{module}) by a dotted suffix (`q_proj`, `self_attn.q_proj`,
    `model.layers.3.self_attn.q_proj`). A key that is a regular expression is refused
    (a pattern the engine would not match as PEFT does must not scale silently wrong, and
    a file's regex is never run)."""
    for key, value in (patterns or {}).items():
        if not isinstance(key, str) or _REGEX.search(key):
            raise AdapterError(
                f"rank_pattern / alpha_pattern key {key!r}: only module names are supported, "
                "not regular expressions"
            )
        bare = key.removeprefix("base_model.model.").removeprefix("model.")
        if name == bare or name.endswith("." + bare):
            return value
    return default
