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
    qwen2moe, qwen3moe
                 the experts' width (and the shared expert's) is metadata transformers
                 does not map; llama.cpp renormalises Qwen3-MoE's top-k weights, not
                 Qwen2-MoE's (the file's expert_weights_norm, where it has one, decides)
    llama with expert_count > 0
                 Mixtral: transformers reads a Llama config, which becomes Mixtral's
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
# The files gguf_tensors.py reads (kept packed, or expanded for the float path); others
# expand through transformers' reader.
READ_HERE = frozenset(
    {"llama", "qwen2", "qwen3", "qwen2moe", "qwen3moe", "gemma", "gemma2", "gemma3", "phi3"}
)
NORM_PLUS_ONE = frozenset({"gemma", "gemma2", "gemma3"})  # stored norm weight = w + 1
PERMUTED_QK = frozenset({"llama"})  # q/k rows interleaved per head by llama.cpp's converter
SKIPPED = frozenset({"rope_factors_long", "rope_factors_short"})  # read into the config

# The depth of Gemma-2-27B, whose queries llama.cpp scales by (hidden / heads) ** -0.5
# rather than head_dim ** -0.5 (the one Gemma 2 size where the two differ by design).
_GEMMA2_27B_LAYERS = 46


def fix_config(arch: str, meta: Callable[[str], object], tensor, config):
    """Fill in `config` (transformers' reading of the file) what transformers leaves out,
    and return it (a new config where the family differs: Mixtral). `meta(key)`: a
    metadata value or None; `tensor(name)`: a float tensor's values or None."""
    window = meta(f"{arch}.attention.sliding_window")
    if arch in ("qwen2moe", "qwen3moe"):
        if (width := meta(f"{arch}.expert_feed_forward_length")) is not None:
            config.moe_intermediate_size = int(width)
        if (shared := meta(f"{arch}.expert_shared_feed_forward_length")) is not None:
            config.shared_expert_intermediate_size = int(shared)
        norm = meta(f"{arch}.expert_weights_norm")
        config.norm_topk_prob = bool(norm) if norm is not None else arch == "qwen3moe"
    if arch == "llama" and int(meta("llama.expert_count") or 0) > 0:
        return _mixtral(config, int(meta("llama.expert_count")), meta("llama.expert_used_count"))
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
    return config


def _mixtral(llama, experts: int, used) -> object:
    """The Mixtral config of a Llama config read from a file with experts (llama.cpp
    stores Mixtral as "llama"): the same fields, the experts' count and top-k added."""
    from transformers import MixtralConfig

    fields = llama.to_dict()
    for key in ("model_type", "architectures", "transformers_version", "mlp_bias",
                "attention_bias", "pretraining_tp"):  # fmt: skip
        fields.pop(key, None)
    top_k = int(used) if used is not None else 2
    return MixtralConfig(**fields, num_local_experts=experts, num_experts_per_tok=top_k)
