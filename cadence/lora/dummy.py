"""Random PEFT LoRA adapters for a model's shape, as --load-format dummy is for weights:
benchmarks (and tests) of many adapters without a hub to fetch them from."""

from __future__ import annotations

import json
import os

import torch
from safetensors.torch import save_file

TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def projection_shapes(config: dict) -> dict[str, tuple[int, int]]:
    """PEFT's module name -> (in, out) features of a Llama-style decoder layer."""
    h, inter = config["hidden_size"], config["intermediate_size"]
    heads = config["num_attention_heads"]
    head = config.get("head_dim") or h // heads
    kv = (config.get("num_key_value_heads") or heads) * head
    return {
        "q_proj": (h, heads * head),
        "k_proj": (h, kv),
        "v_proj": (h, kv),
        "o_proj": (heads * head, h),
        "gate_proj": (h, inter),
        "up_proj": (h, inter),
        "down_proj": (inter, h),
    }


def write_dummy_adapter(
    model_dir: str,
    out: str,
    rank: int,
    seed: int,
    targets: tuple[str, ...] = TARGETS,
    std: float = 0.01,
    device: str = "cpu",
) -> str:
    """A PEFT folder at `out`: rank-`rank` A and B ~ N(0, std) on `targets` of every layer
    of the model at `model_dir` (its config.json), alpha = 2 rank; bf16 tensors."""
    with open(os.path.join(model_dir, "config.json")) as f:
        config = json.load(f)
    shapes = projection_shapes(config)
    gen = torch.Generator(device=device).manual_seed(seed)
    tensors = {}
    for layer in range(config["num_hidden_layers"]):
        for name in targets:
            block = "mlp" if name in ("gate_proj", "up_proj", "down_proj") else "self_attn"
            d_in, d_out = shapes[name]
            key = f"base_model.model.model.layers.{layer}.{block}.{name}"
            a = torch.randn(rank, d_in, generator=gen, device=device) * std
            b = torch.randn(d_out, rank, generator=gen, device=device) * std
            tensors[f"{key}.lora_A.weight"] = a.bfloat16().cpu()
            tensors[f"{key}.lora_B.weight"] = b.bfloat16().cpu()
    os.makedirs(out, exist_ok=True)
    save_file(tensors, os.path.join(out, "adapter_model.safetensors"))
    with open(os.path.join(out, "adapter_config.json"), "w") as f:
        json.dump(
            {"peft_type": "LORA", "r": rank, "lora_alpha": 2 * rank, "target_modules": targets},
            f,
        )
    return out
