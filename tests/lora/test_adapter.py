"""Reading a PEFT folder: the scale each module gets (alpha / r, rsLoRA's alpha / sqrt(r),
rank_pattern and alpha_pattern), and what is refused before anything loads, naming why."""

from __future__ import annotations

import json
import math

import pytest
import torch
from safetensors.torch import save_file

from cadence.lora.adapter import AdapterError, inspect_adapter, load_adapter

PREFIX = "base_model.model.model.layers"


def write(folder, config: dict, tensors: dict[str, torch.Tensor]) -> str:
    folder.mkdir(exist_ok=True)
    (folder / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", **config}))
    save_file(tensors, str(folder / "adapter_model.safetensors"))
    return str(folder)


def pair(layer: int, module: str, r: int, d_in: int = 8, d_out: int = 8) -> dict:
    return {
        f"{PREFIX}.{layer}.{module}.lora_A.weight": torch.randn(r, d_in),
        f"{PREFIX}.{layer}.{module}.lora_B.weight": torch.randn(d_out, r),
    }


def test_scales(tmp_path):
    tensors = {
        **pair(0, "self_attn.q_proj", 4),
        **pair(1, "self_attn.q_proj", 8),
        **pair(0, "mlp.down_proj", 4),
    }
    config = {
        "r": 4,
        "lora_alpha": 8,
        "rank_pattern": {"layers.1.self_attn.q_proj": 8},
        "alpha_pattern": {"down_proj": 2},
    }
    spec = inspect_adapter(write(tmp_path / "a", config, tensors), max_rank=8)
    assert spec.rank == 8
    assert spec.modules[(0, "self_attn.q_proj")] == (4, 2.0)
    assert spec.modules[(1, "self_attn.q_proj")] == (8, 1.0)
    assert spec.modules[(0, "mlp.down_proj")] == (4, 0.5)
    rs = inspect_adapter(
        write(
            tmp_path / "b", {"r": 4, "lora_alpha": 8, "use_rslora": True}, pair(0, "mlp.up_proj", 4)
        ),
        8,
    )
    assert rs.modules[(0, "mlp.up_proj")] == (4, 8 / math.sqrt(4))
    adapter = load_adapter(str(tmp_path / "a"), 8)
    a, b, scale = adapter.modules[(1, "self_attn.q_proj")]
    assert a.shape == (8, 8) and b.shape == (8, 8) and scale == 1.0


@pytest.mark.parametrize(
    ("config", "tensors", "why"),
    [
        ({"r": 4, "use_dora": True}, pair(0, "self_attn.q_proj", 4), "DoRA"),
        ({"r": 4, "bias": "lora_only"}, pair(0, "self_attn.q_proj", 4), "LoRA biases"),
        ({"r": 4, "peft_type": "IA3"}, pair(0, "self_attn.q_proj", 4), "only LoRA adapters"),
        ({"r": 32}, pair(0, "self_attn.q_proj", 32), "rank 32 is above"),
        ({"r": 4}, {"base_model.model.lm_head.lora_A.weight": torch.randn(4, 8)}, "LM head"),
        ({"r": 4}, {"base_model.model.model.embed_tokens.lora_embedding_A": torch.randn(4, 8)}, "embeddings"),
        ({"r": 4}, {**pair(0, "self_attn.q_proj", 4), "base_model.model.lm_head.modules_to_save.default.weight": torch.randn(8, 8)}, "modules_to_save"),
        ({"r": 4}, {f"{PREFIX}.0.self_attn.q_proj.lora_A.weight": torch.randn(4, 8)}, "lacks its lora_A or lora_B"),
        ({"r": 4}, {**pair(0, "self_attn.q_proj", 4), f"{PREFIX}.0.self_attn.q_proj.lora_B.weight": torch.randn(8, 3)}, "do not pair"),
        ({"r": 8}, pair(0, "self_attn.q_proj", 4), "its config says 8"),
        ({"r": 4, "alpha_pattern": {".*q_proj": 2}}, pair(0, "self_attn.q_proj", 4), "not regular expressions"),
    ],
)  # fmt: skip
def test_refusals_name_why(tmp_path, config, tensors, why):
    with pytest.raises(AdapterError, match=why):
        inspect_adapter(write(tmp_path / "x", config, tensors), max_rank=16)


def test_folder_problems(tmp_path):
    with pytest.raises(AdapterError, match="not a folder"):
        inspect_adapter(str(tmp_path / "none"), 16)
    (tmp_path / "empty").mkdir()
    with pytest.raises(AdapterError, match="no adapter_config.json"):
        inspect_adapter(str(tmp_path / "empty"), 16)
    (tmp_path / "empty" / "adapter_config.json").write_text("[1, 2]")
    with pytest.raises(AdapterError, match="not a JSON object"):
        inspect_adapter(str(tmp_path / "empty"), 16)
    (tmp_path / "empty" / "adapter_config.json").write_text("{")
    with pytest.raises(AdapterError, match="not readable JSON"):
        inspect_adapter(str(tmp_path / "empty"), 16)
