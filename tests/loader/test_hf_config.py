"""Reading config.json without transformers gives exactly what transformers' AutoConfig gives
for every field the engine uses, and falls back to AutoConfig whenever it would have to
guess a default."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from model_helpers import ARCHS

from cadence.layers.rotary import _inv_freq
from cadence.loader.hf_config import read_config

EIGHT_B = os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks", "llama-3.1-8b")

# field -> the default the model code uses when the config lacks it (None: must exist)
USED = {
    "hidden_size": None,
    "intermediate_size": None,
    "num_hidden_layers": None,
    "num_attention_heads": None,
    "num_key_value_heads": None,
    "rms_norm_eps": None,
    "vocab_size": None,
    "max_position_embeddings": None,
    "hidden_act": None,
    "tie_word_embeddings": None,
    "head_dim": "missing",
    "attention_bias": False,
    "mlp_bias": False,
    "sliding_window": "missing",
    "use_sliding_window": True,
    "eos_token_id": "missing",
    "architectures": "missing",
    "model_type": None,
}


def _same_fields(path: str) -> None:
    from transformers import AutoConfig

    ours, theirs = read_config(path), AutoConfig.from_pretrained(path)
    assert ours is not None, "expected the direct path"
    for field, default in USED.items():
        if default is None:
            assert getattr(ours, field) == getattr(theirs, field), field
        else:
            assert getattr(ours, field, default) == getattr(theirs, field, default), field
    head_dim = getattr(theirs, "head_dim", None) or theirs.hidden_size // theirs.num_attention_heads
    for a, b in zip(_inv_freq(ours, head_dim), _inv_freq(theirs, head_dim)):
        assert torch.equal(torch.as_tensor(a), torch.as_tensor(b))


@pytest.mark.parametrize("kind", ARCHS)
def test_tiny_checkpoints_read_the_same_as_autoconfig(kind, tiny_model_dir):
    _same_fields(tiny_model_dir(kind))


def test_llama_3_1_config_and_its_llama3_rope(tmp_path):
    _same_fields(EIGHT_B)
    from transformers import AutoConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    ours, _ = _inv_freq(read_config(EIGHT_B), 128)
    theirs, _ = ROPE_INIT_FUNCTIONS["llama3"](AutoConfig.from_pretrained(EIGHT_B), "cpu")
    assert torch.equal(ours, theirs)  # bit for bit
    # v4 layout with linear scaling ("type" rather than "rope_type")
    raw = json.loads(Path(EIGHT_B, "config.json").read_text())
    raw["rope_scaling"] = {"type": "linear", "factor": 4.0}
    (tmp_path / "config.json").write_text(json.dumps(raw))
    _same_fields(str(tmp_path))


@pytest.mark.parametrize(
    "change",
    [
        {"model_type": "gemma"},  # a type we do not know
        {"rope_scaling": {"rope_type": "yarn", "factor": 4.0}},  # a rope we do not compute
        {"rope_theta": None},  # no theta: transformers' default would apply
    ],
)
def test_anything_uncertain_goes_through_autoconfig(change, tmp_path):
    raw = json.loads(Path(EIGHT_B, "config.json").read_text())
    raw.update(change)
    raw = {k: v for k, v in raw.items() if v is not None}
    (tmp_path / "config.json").write_text(json.dumps(raw))
    assert read_config(str(tmp_path)) is None


@pytest.mark.parametrize("kind", ["mistral", "qwen3"])
def test_a_missing_type_specific_field_goes_through_autoconfig(kind, tiny_model_dir, tmp_path):
    shutil.copy(os.path.join(tiny_model_dir(kind), "config.json"), tmp_path / "config.json")
    raw = json.loads((tmp_path / "config.json").read_text())
    raw.pop("sliding_window" if kind == "mistral" else "head_dim")
    (tmp_path / "config.json").write_text(json.dumps(raw))
    assert read_config(str(tmp_path)) is None


def test_engine_start_needs_no_transformers(tiny_model_dir):
    """Config, rope tables and end-of-sequence ids of a Llama checkpoint, in a fresh process:
    transformers is never imported."""
    code = (
        "import sys\n"
        "from cadence.loader.loader import load_hf_config\n"
        "from cadence.layers.rotary import RotaryEmbedding\n"
        "import cadence.worker.model_runner\n"
        "from cadence.loader.hf_config import eos_token_ids\n"
        f"path = {tiny_model_dir('llama')!r}\n"
        "config = load_hf_config(path)\n"
        "RotaryEmbedding(config, 16, 64)\n"
        "eos_token_ids(path, config)\n"
        "assert 'transformers' not in sys.modules, 'transformers was imported'\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
