"""PEFT adapters for the tiny models, made with peft itself, and transformers + peft as the
oracle. (A module of its own name: tests import it as they do model_helpers.)"""

from __future__ import annotations

import os
import zlib

import torch

# name -> (rank, alpha, targets, rsLoRA): different ranks, targets and scalings
ADAPTERS = {
    "qv8": (8, 16, ["q_proj", "v_proj"], False),
    "all16": (
        16,
        32,
        ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
        True,
    ),
    "mlp4": (4, 8, ["o_proj", "gate_proj", "down_proj"], False),
}
# Phi-3 keeps q/k/v and gate/up fused in its checkpoint: PEFT adapts the fused modules
ADAPTERS_FUSED = {"fused8": (8, 16, ["qkv_proj", "o_proj", "gate_up_proj", "down_proj"], False)}


def make_adapter(base_dir: str, name: str, out_dir: str) -> str:
    """A PEFT LoRA adapter of `name`'s shape over the model at `base_dir`, with random A
    and B (peft's init_lora_weights=False: not the identity), saved as PEFT saves it."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    rank, alpha, targets, rs = {**ADAPTERS, **ADAPTERS_FUSED}[name]
    path = os.path.join(out_dir, f"adapter-{name}")
    if os.path.exists(os.path.join(path, "adapter_model.safetensors")):
        return path
    base = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
    config = LoraConfig(
        r=rank,
        lora_alpha=alpha,
        target_modules=targets,
        use_rslora=rs,
        init_lora_weights=False,
        lora_dropout=0.0,
    )
    torch.manual_seed(zlib.crc32(name.encode()))
    model = get_peft_model(base, config)
    with torch.no_grad():  # big enough to change greedy choices of a random model
        for pname, p in model.named_parameters():
            if "lora_" in pname:
                p.normal_(0.0, 0.2)
    model.save_pretrained(path)
    return path


def peft_model(base_dir: str, adapter_dir: str):
    """transformers + peft in float32, eager attention: the oracle for one adapter."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(
        base_dir, dtype=torch.float32, attn_implementation="eager"
    )
    return PeftModel.from_pretrained(base, adapter_dir).eval()
