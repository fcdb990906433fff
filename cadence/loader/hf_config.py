"""A checkpoint's config.json and generation_config.json, read without transformers where
that is safe.

Importing transformers' config classes costs 1-2 s on a laptop and ~4 s on the H200 image
at every engine start: the classes pull in its modeling and generation code, and with them
scikit-learn and torch._dynamo. The engine reads ~20 plain fields. `read_config` parses
config.json itself, but only when the file states every field whose value transformers would
otherwise fill in with a default of its own for that model type, and the rope type is one
`cadence/layers/rotary.py` computes itself. Anything else returns None and goes through
transformers' AutoConfig, so no default is ever guessed. Configs written by transformers
5.x, and those of the public Llama / Qwen / Mistral checkpoints, state them all.
"""

from __future__ import annotations

import json
import os
from types import SimpleNamespace

# Every fast-path config states these ...
_COMMON = (
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "rms_norm_eps",
    "vocab_size",
    "max_position_embeddings",
    "hidden_act",
    "tie_word_embeddings",
)
# ... and, per model type, those whose defaults differ between transformers' classes (or
# from the `getattr` defaults the model code uses for fields a class lacks).
_BY_TYPE: dict[str, tuple[str, ...]] = {
    "llama": (),
    "mistral": ("sliding_window",),
    "qwen2": ("sliding_window", "use_sliding_window"),
    "qwen3": ("sliding_window", "use_sliding_window", "head_dim"),
}
FAST_ROPE_TYPES = ("default", "linear", "llama3")


def rope_parameters(raw: dict) -> dict:
    """transformers 5's `rope_parameters` from either layout: v5's dict, or v4's
    `rope_theta` + `rope_scaling` (whose `type` key older files use for `rope_type`)."""
    rope = dict(raw.get("rope_parameters") or raw.get("rope_scaling") or {})
    if "rope_type" not in rope:
        rope["rope_type"] = rope.pop("type", "default")
    if "rope_theta" not in rope and raw.get("rope_theta") is not None:
        rope["rope_theta"] = raw["rope_theta"]
    return rope


def read_config(path: str) -> SimpleNamespace | None:
    """config.json as attributes, or None where transformers must read it."""
    with open(os.path.join(path, "config.json")) as f:
        raw = json.load(f)
    required = _BY_TYPE.get(raw.get("model_type"))
    if required is None or any(k not in raw for k in _COMMON + required):
        return None
    rope = rope_parameters(raw)
    if rope["rope_type"] not in FAST_ROPE_TYPES or "rope_theta" not in rope:
        return None
    config = SimpleNamespace(**raw)
    config.rope_parameters = rope
    config.rope_scaling = None  # folded into rope_parameters, as transformers 5 does
    return config


def language_view(config):
    """A vision-language config seen as its language model's (what the KV cache, the
    attention backends and the decoder read), with the rest beside it: `vision_config`,
    `image_token_id`, `architectures` (the whole model's) and `vision_language` (the
    whole config: projector and feature-layer options). Any other config as it is."""
    text = getattr(config, "text_config", None)
    if text is None or getattr(config, "vision_config", None) is None:
        return config
    token = getattr(config, "image_token_id", None)
    if token is None:
        token = getattr(config, "image_token_index", None)
    if token is None:
        raise ValueError("a vision-language config without image_token_id")
    if not hasattr(text, "tie_word_embeddings"):  # (Qwen2-VL's states it for the whole)
        text.tie_word_embeddings = bool(getattr(config, "tie_word_embeddings", False))
    text.architectures = getattr(config, "architectures", None)
    text.vision_config = config.vision_config
    text.image_token_id = int(token)
    text.vision_language = config
    return text


def generation_eos_ids(path: str) -> list[int]:
    """eos_token_id of generation_config.json (an int or a list), if the file exists."""
    try:
        with open(os.path.join(path, "generation_config.json")) as f:
            eos = json.load(f).get("eos_token_id")
    except (OSError, ValueError):
        return []
    if eos is None:
        return []
    return [int(t) for t in ([eos] if isinstance(eos, int) else eos)]


def eos_token_ids(path: str, hf_config) -> tuple[int, ...]:
    """End-of-sequence ids from config.json and, where present, generation_config.json."""
    ids: list[int] = []
    src = getattr(hf_config, "eos_token_id", None)
    for tid in [*([src] if isinstance(src, int) else (src or [])), *generation_eos_ids(path)]:
        if int(tid) not in ids:
            ids.append(int(tid))
    return tuple(ids)
