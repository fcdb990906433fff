"""What llama.cpp's GGUF layout does differently by architecture, against Hugging Face's:
tensor names, what is stored transformed, and config fields that transformers' GGUF reader
leaves out (as of transformers 5).

    llama (Mistral's files too), qwen2, qwen3
                 the shared names (gguf_tensors._BLOCK); llama's q/k rows are permuted
    gemma2, gemma3
                 ffn_norm is the pre-feed-forward norm; post_attention_norm and
                 post_ffw_norm the sandwich's other two; every norm weight is stored as
                 1 + w (llama.cpp folds in the 1 that Gemma's RMSNorm adds); the soft-caps
                 and the window are metadata transformers does not map
    phi3         attn_qkv and ffn_up hold q|k|v and gate|up fused, as Phi-3's checkpoints
                 do; the window is metadata; LongRoPE's factors are tensors
"""

from __future__ import annotations

from collections.abc import Callable

_SANDWICH = {
    "ffn_norm": "pre_feedforward_layernorm",
    "post_attention_norm": "post_attention_layernorm",
    "post_ffw_norm": "post_feedforward_layernorm",
}
BLOCK_NAMES: dict[str, dict[str, str]] = {
    "gemma2": _SANDWICH,
    "gemma3": _SANDWICH,
    "phi3": {"attn_qkv": "self_attn.qkv_proj", "ffn_up": "mlp.gate_up_proj"},
}
NORM_PLUS_ONE = frozenset({"gemma", "gemma2", "gemma3"})  # stored norm weight = w + 1
PERMUTED_QK = frozenset({"llama"})  # q/k rows interleaved per head by llama.cpp's converter
SKIPPED = frozenset({"rope_factors_long", "rope_factors_short"})  # read into the config

# The depth of Gemma-2-27B, whose queries llama.cpp scales by (hidden / heads) ** -0.5
# rather than head_dim ** -0.5 (the one Gemma 2 size where the two differ by design).
_GEMMA2_27B_LAYERS = 46


def fix_config(arch: str, meta: Callable[[str], object], tensor, config) -> None:
    """Fill in `config` (transformers' reading of the file) what transformers leaves out.
    `meta(key)`: a metadata value or None; `tensor(name)`: a float tensor's values or None."""
    window = meta(f"{arch}.attention.sliding_window")
    if arch == "gemma2":
        for field in ("attn_logit_softcapping", "final_logit_softcapping"):
            if (value := meta(f"{arch}.{field}")) is not None:
                setattr(config, field, float(value))
        if window is not None:
            config.sliding_window = int(window)
        is_27b = config.num_hidden_layers == _GEMMA2_27B_LAYERS
        per_head = config.hidden_size // config.num_attention_heads
        config.query_pre_attn_scalar = per_head if is_27b else config.head_dim
    if arch == "phi3":
        if window is not None:
            config.sliding_window = int(window)
        long, short = tensor("rope_factors_long.weight"), tensor("rope_factors_short.weight")
        if long is not None and short is not None:
            original = meta(f"{arch}.rope.scaling.original_context_length")
            params = dict(getattr(config, "rope_parameters", None) or {})
            params.update(
                rope_type="longrope",
                long_factor=[float(x) for x in long],
                short_factor=[float(x) for x in short],
                original_max_position_embeddings=int(original or config.max_position_embeddings),
            )
            config.rope_parameters = params
            config.original_max_position_embeddings = params["original_max_position_embeddings"]
