"""Whether a checkpoint is served as an embedding model, and how it pools (`--runner`).

    spec = resolve_pooling(model_config, path, hf_config)   None: a generative model

`--runner auto` serves a headless checkpoint (architectures `Qwen3Model`, `LlamaModel`, ...:
no LM head) as an embedding model and everything else as a generative one; `--runner
pooling` makes any supported decoder an embedding model (Qwen3-Embedding ships as
`Qwen3ForCausalLM`). How it pools comes, in order, from `--pooler-config`, the checkpoint's
sentence-transformers files (modules.json: its Pooling module's mode, and whether a
Normalize module follows), or the decoder default: the last token's state, normalized.
Matryoshka lengths come from config.json (`matryoshka_dimensions`, or `is_matryoshka`).
"""

from __future__ import annotations

import json
import os

from cadence.config import ModelConfig, PoolingSpec
from cadence.config_values import json_object

POOLING_TYPES = ("LAST", "MEAN", "CLS")
_ST_MODULES = {"Transformer", "Pooling", "Normalize"}

# sentence-transformers' Pooling config flags -> our pooling type
_ST_MODES = {
    "pooling_mode_lasttoken": "LAST",
    "pooling_mode_mean_tokens": "MEAN",
    "pooling_mode_cls_token": "CLS",
}


def is_headless(hf_config) -> bool:
    """A base-model checkpoint (`XxxModel`): hidden states out, no LM head."""
    archs = getattr(hf_config, "architectures", None) or []
    return any(a.endswith("Model") and "For" not in a for a in archs)


def resolve_pooling(mc: ModelConfig, path: str, hf_config) -> PoolingSpec | None:
    """The pooling of the model at `path`, or None when it is served for generation.
    Raises ValueError on a runner, pooler config or sentence-transformers mode we lack."""
    if mc.runner == "generate" or (mc.runner == "auto" and not is_headless(hf_config)):
        if mc.pooler_config is not None:
            raise ValueError("--pooler-config is for embedding models (--runner pooling)")
        return None
    if getattr(hf_config, "is_causal", True) is False:
        # (some embedding checkpoints attend both ways; our kernels are causal)
        raise ValueError("the model's config asks for bidirectional attention (is_causal: false)")
    spec = PoolingSpec(hidden_size=int(hf_config.hidden_size))
    _apply_sentence_transformers(spec, path)
    if mc.pooler_config is not None:
        _apply_override(spec, mc.pooler_config)
    dims = getattr(hf_config, "matryoshka_dimensions", None)
    if dims:
        spec.matryoshka_dimensions = sorted({int(d) for d in dims})
    spec.any_dimensions = bool(getattr(hf_config, "is_matryoshka", False)) and not dims
    return spec


def _apply_sentence_transformers(spec: PoolingSpec, path: str) -> None:
    modules_file = os.path.join(path, "modules.json")
    if not os.path.isfile(modules_file):
        return
    with open(modules_file) as f:
        modules = json.load(f)
    kinds = {str(m.get("type", "")).rpartition(".")[2]: m for m in modules if isinstance(m, dict)}
    unknown = set(kinds) - _ST_MODULES
    if unknown:  # (a Dense projection, say: vectors without it would be silently wrong)
        raise ValueError(
            f"the checkpoint's sentence-transformers modules {sorted(unknown)} are not "
            "supported (Transformer, Pooling and Normalize are)"
        )
    spec.normalize = "Normalize" in kinds
    pooling = kinds.get("Pooling")
    if pooling is None:
        return
    sub = os.path.normpath(str(pooling.get("path", "")))
    if os.path.isabs(sub) or sub.split(os.sep)[0] == "..":
        raise ValueError(f"modules.json points outside the model folder: {sub!r}")
    config_file = os.path.join(path, sub, "config.json")
    if not os.path.isfile(config_file):
        return
    with open(config_file) as f:
        st = json.load(f)
    if st.get("include_prompt") is False:
        raise ValueError(
            "pooling that leaves the prompt out (include_prompt: false) is not supported"
        )
    modes = [ours for key, ours in _ST_MODES.items() if st.get(key)]
    others = [
        k for k, v in st.items() if k.startswith("pooling_mode_") and v and k not in _ST_MODES
    ]
    if others or len(modes) > 1:
        raise ValueError(
            f"the checkpoint's sentence-transformers pooling ({', '.join(others + modes)}) is "
            "not supported: one of last token, mean or CLS"
        )
    if modes:
        spec.pooling_type = modes[0]


def _apply_override(spec: PoolingSpec, text: str) -> None:
    override = json_object(text, "--pooler-config")
    unknown = set(override) - {"pooling_type", "normalize"}
    if unknown:
        raise ValueError(f"--pooler-config: unknown keys {sorted(unknown)}")
    kind = str(override.get("pooling_type", spec.pooling_type)).upper()
    if kind not in POOLING_TYPES:
        raise ValueError(f"--pooler-config pooling_type must be one of {', '.join(POOLING_TYPES)}")
    spec.pooling_type = kind
    if "normalize" in override:
        if not isinstance(override["normalize"], bool):
            raise ValueError("--pooler-config normalize must be true or false")
        spec.normalize = override["normalize"]
