"""Tiny random models of each supported architecture, and transformers as the oracle.

Shared by the tests (a module of its own name: several conftest.py files would clash)."""

from __future__ import annotations

import torch

TINY = dict(
    vocab_size=512,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=512,
    rms_norm_eps=1e-6,
    # A wider init than the default 0.02 keeps logits far enough apart that float32
    # rounding differences cannot flip a greedy choice.
    initializer_range=0.1,
)


def build_tiny(kind: str):
    import transformers as tf

    if kind == "llama":
        return tf.LlamaConfig(**TINY, tie_word_embeddings=False), tf.LlamaForCausalLM
    if kind == "llama-long":  # a few thousand positions: long prompts, split-KV decodes
        return (
            tf.LlamaConfig(**{**TINY, "max_position_embeddings": 4096}, tie_word_embeddings=False),
            tf.LlamaForCausalLM,
        )
    if kind == "llama-tied":  # SmolLM-style: tied embeddings
        return tf.LlamaConfig(**TINY, tie_word_embeddings=True), tf.LlamaForCausalLM
    if kind == "llama-mqa":  # one KV head: fewer KV heads than tensor-parallel ranks
        return (
            tf.LlamaConfig(**{**TINY, "num_key_value_heads": 1}, tie_word_embeddings=False),
            tf.LlamaForCausalLM,
        )
    if kind == "mistral":
        return tf.MistralConfig(**TINY, sliding_window=None, head_dim=16), tf.MistralForCausalLM
    if kind == "qwen2":
        return tf.Qwen2Config(**TINY, tie_word_embeddings=False), tf.Qwen2ForCausalLM
    if kind == "qwen3":
        return tf.Qwen3Config(**TINY, head_dim=32, tie_word_embeddings=False), tf.Qwen3ForCausalLM
    if kind == "qwen3-embed":  # headless (Qwen3Model): an embedding model, Matryoshka lengths
        config = tf.Qwen3Config(**TINY, head_dim=32, matryoshka_dimensions=[16, 32])
        config.architectures = ["Qwen3Model"]
        return config, tf.Qwen3Model
    if kind in ZOO:
        return ZOO[kind]()
    if kind == "mistral-window-d24":  # a head dim that is not a power of two (Phi-3's is 96)
        return _zoo_config(
            "MistralConfig", "MistralForCausalLM", sliding_window=WINDOW, head_dim=24
        )
    raise ValueError(kind)


ARCHS = ["llama", "llama-tied", "mistral", "qwen2", "qwen3"]

WINDOW = 8  # the zoo's sliding windows: shorter than most test prompts


def _adjusted(built, adjust):
    """(config, a builder of the model that then calls adjust(name, tensor) on each of its
    parameters and buffers, under no_grad): for what transformers initialises too tamely to
    test (zero biases)."""
    config, cls = built

    def build(config):
        model = cls(config)
        with torch.no_grad():
            for name, tensor in [*model.named_parameters(), *model.named_buffers()]:
                adjust(name, tensor)
        return model

    build.__name__ = cls.__name__  # (tests name the architecture by the builder's name)
    return config, build


def _gpt_oss_weights(name: str, tensor: torch.Tensor) -> None:
    """Random biases and sinks (transformers starts the biases at zero, so a dropped one
    would pass, and the sinks near it), and gate/up weights wide enough that the SwiGLU
    clamp at its usual 7.0 bites (the limit stays 7.0: transformers 5.17 ignores the
    config's swiglu_limit)."""
    if name.endswith("bias"):
        tensor.normal_(0.0, 0.1)
    elif name.endswith("sinks"):
        tensor.normal_(0.0, 1.0)
    elif name.endswith("gate_up_proj"):
        tensor.mul_(12.0)


def _correction_bias(name: str, tensor: torch.Tensor) -> None:
    """Random router correction biases (transformers starts them at zero, which would let
    a dropped one pass)."""
    if name.endswith("e_score_correction_bias"):
        tensor.normal_(0.0, 0.1)


def _zoo_config(name: str, arch: str, **options):
    """A tiny config of transformers' `name`, three layers (so interleaved layer kinds show),
    the family's distinctive options on."""
    import transformers as tf

    base = {k: v for k, v in TINY.items() if k != "rms_norm_eps"}
    base.update(pad_token_id=0, bos_token_id=1, eos_token_id=2)  # inside the tiny vocabulary
    config = getattr(tf, name)(**{**base, "num_hidden_layers": 3, **options})
    return config, getattr(tf, arch)


# DeepSeek's latent attention and experts, tiny: a 32 + 16 latent (triton_mla's tiles need
# powers of two from 16), every head expanded from it (4 KV heads: transformers repeats none),
# 8 experts of 48, top 2, after one dense layer.
_TINY_MLA = dict(
    num_key_value_heads=4,
    kv_lora_rank=32,
    qk_nope_head_dim=16,
    qk_rope_head_dim=16,
    v_head_dim=12,
    n_routed_experts=8,
    num_experts_per_tok=2,
    moe_intermediate_size=48,
    first_k_dense_replace=1,
)

# kind -> its tiny config and transformers class: every dense family, distinctive options on.
ZOO = {
    "mistral-window": lambda: _zoo_config(
        "MistralConfig", "MistralForCausalLM", sliding_window=WINDOW, head_dim=16
    ),
    "qwen2-window": lambda: _zoo_config(
        "Qwen2Config",
        "Qwen2ForCausalLM",
        use_sliding_window=True,
        sliding_window=WINDOW,
        max_window_layers=1,  # layers 1 and 2 slide, layer 0 sees everything
    ),
    "gemma": lambda: _zoo_config(
        "GemmaConfig", "GemmaForCausalLM", head_dim=32, hidden_act="gelu_pytorch_tanh"
    ),
    "gemma2": lambda: _zoo_config(
        "Gemma2Config",
        "Gemma2ForCausalLM",
        head_dim=32,
        sliding_window=WINDOW,
        attn_logit_softcapping=5.0,  # low, so the cap bends the scores it sees
        # Gemma 2's own: a cap as low as the scores' would round near-equal logits to ties
        # (the cap keeps their order, so only logprobs show it: test_zoo checks them).
        final_logit_softcapping=30.0,
        query_pre_attn_scalar=24,
    ),
    "gemma3": lambda: _zoo_config(
        "Gemma3TextConfig",
        "Gemma3ForCausalLM",
        head_dim=32,
        sliding_window=WINDOW,
        layer_types=["sliding_attention", "full_attention", "sliding_attention"],
        rope_parameters={
            "full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 100000.0},
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
        },
    ),
    "phi3": lambda: _zoo_config(
        "Phi3Config",
        "Phi3ForCausalLM",
        sliding_window=WINDOW,
        rope_parameters={
            "rope_type": "default",
            "rope_theta": 10000.0,
            "partial_rotary_factor": 0.75,
        },  # Phi-4-mini's
    ),
    "granite": lambda: _zoo_config(
        "GraniteConfig",
        "GraniteForCausalLM",
        embedding_multiplier=3.0,
        residual_multiplier=0.5,
        attention_multiplier=0.2,
        logits_scaling=2.0,
    ),
    "olmo2": lambda: _zoo_config("Olmo2Config", "Olmo2ForCausalLM"),
    "smollm3": lambda: _zoo_config("SmolLM3Config", "SmolLM3ForCausalLM", no_rope_layers=[1, 0, 1]),
    "starcoder2": lambda: _zoo_config(
        "Starcoder2Config", "Starcoder2ForCausalLM", sliding_window=WINDOW, use_bias=True
    ),
    "stablelm": lambda: _zoo_config(
        "StableLmConfig",
        "StableLmForCausalLM",
        use_qkv_bias=True,
        rope_parameters={
            "rope_type": "default",
            "rope_theta": 10000.0,
            "partial_rotary_factor": 0.25,
        },
    ),
    "cohere": lambda: _zoo_config("CohereConfig", "CohereForCausalLM", logit_scale=0.5),
    "cohere2": lambda: _zoo_config(
        "Cohere2Config",
        "Cohere2ForCausalLM",
        logit_scale=0.5,
        sliding_window=WINDOW,
        layer_types=["sliding_attention", "full_attention", "sliding_attention"],
    ),
    "glm4": lambda: _zoo_config(
        "Glm4Config",
        "Glm4ForCausalLM",
        attention_bias=True,
        rope_parameters={
            "rope_type": "default",
            "rope_theta": 10000.0,
            "partial_rotary_factor": 0.5,
        },
    ),
    "stablelm-parallel": lambda: _zoo_config(
        "StableLmConfig", "StableLmForCausalLM", use_parallel_residual=True
    ),
    # Mixtures of experts: 8 experts, top 2 (so in a short batch some get no token).
    "mixtral": lambda: _zoo_config(
        "MixtralConfig", "MixtralForCausalLM", num_local_experts=8, num_experts_per_tok=2
    ),
    "qwen2-moe": lambda: _zoo_config(
        "Qwen2MoeConfig",
        "Qwen2MoeForCausalLM",
        num_experts=8,
        num_experts_per_tok=2,
        moe_intermediate_size=48,
        shared_expert_intermediate_size=96,
        norm_topk_prob=False,
        mlp_only_layers=[1],  # layer 1 keeps a dense MLP
    ),
    "qwen3-moe": lambda: _zoo_config(
        "Qwen3MoeConfig",
        "Qwen3MoeForCausalLM",
        num_experts=8,
        num_experts_per_tok=2,
        moe_intermediate_size=48,
        norm_topk_prob=True,
    ),
    "olmoe": lambda: _zoo_config(
        "OlmoeConfig", "OlmoeForCausalLM", num_experts=8, num_experts_per_tok=2
    ),
    "granite-moe": lambda: _zoo_config(
        "GraniteMoeConfig",
        "GraniteMoeForCausalLM",
        num_local_experts=8,
        num_experts_per_tok=2,
        embedding_multiplier=3.0,
        residual_multiplier=0.5,
        attention_multiplier=0.2,
        logits_scaling=2.0,
    ),
    # GPT-OSS: sinks, alternating windows, YaRN (factor 32 over a 16-token original context,
    # so it acts within the tiny model's 512), biases everywhere, a clamp that bites.
    "gpt-oss": lambda: _adjusted(
        _zoo_config(
            "GptOssConfig",
            "GptOssForCausalLM",
            num_local_experts=8,
            num_experts_per_tok=2,
            head_dim=16,
            sliding_window=WINDOW,
            rope_parameters={
                "rope_type": "yarn",
                "rope_theta": 150000.0,
                "factor": 32.0,
                "beta_fast": 32.0,
                "beta_slow": 1.0,
                "truncate": False,
                "original_max_position_embeddings": 16,
            },
        ),
        _gpt_oss_weights,
    ),
    # GLM-4.5's MoE (DeepSeek-V3's routing): 8 experts in 2 groups, 1 group eligible per
    # token, a random correction bias (transformers starts it at zero), a dense first layer.
    "glm4-moe": lambda: _adjusted(
        _zoo_config(
            "Glm4MoeConfig",
            "Glm4MoeForCausalLM",
            n_routed_experts=8,
            num_experts_per_tok=2,
            moe_intermediate_size=48,
            n_shared_experts=1,
            n_group=2,
            topk_group=1,
            first_k_dense_replace=1,
            routed_scaling_factor=2.5,
            norm_topk_prob=True,
            use_qk_norm=True,
            attention_bias=True,
            head_dim=32,
            rope_parameters={
                "rope_type": "default",
                "rope_theta": 10000.0,
                "partial_rotary_factor": 0.5,
            },
        ),
        _correction_bias,
    ),
    # DeepSeek-V2 (V2-Lite's q_proj, no q_lora_rank): latent attention, YaRN with its
    # mscale_all_dim (which scales the scores), softmax routing over 2 groups of 4 experts
    # with 1 group eligible and the weights scaled, shared experts, a dense first layer;
    # norm_topk_prob set, which transformers' V2 ignores (and so must we).
    "deepseek-v2": lambda: _zoo_config(
        "DeepseekV2Config",
        "DeepseekV2ForCausalLM",
        **_TINY_MLA,
        q_lora_rank=None,
        n_shared_experts=2,
        topk_method="group_limited_greedy",
        n_group=2,
        topk_group=1,
        routed_scaling_factor=2.0,
        norm_topk_prob=True,
        rope_parameters={
            "rope_type": "yarn",
            "rope_theta": 10000.0,
            "factor": 4.0,
            "original_max_position_embeddings": 128,
            "beta_fast": 32.0,
            "beta_slow": 1.0,
            "mscale": 0.707,
            "mscale_all_dim": 0.707,
        },
    ),
    # DeepSeek-V3: the query's own low-rank compression (q_lora_rank), sigmoid routing with
    # a random correction bias, 2 groups, renormalised and scaled weights; its rope in
    # halves (rope_interleave false; V2 covers the interleaved pairs), YaRN.
    "deepseek-v3": lambda: _adjusted(
        _zoo_config(
            "DeepseekV3Config",
            "DeepseekV3ForCausalLM",
            **_TINY_MLA,
            q_lora_rank=24,
            n_shared_experts=1,
            n_group=2,
            topk_group=1,
            norm_topk_prob=True,
            routed_scaling_factor=2.5,
            rope_interleave=False,
            rope_parameters={
                "rope_type": "yarn",
                "rope_theta": 10000.0,
                "factor": 2.0,
                "original_max_position_embeddings": 256,
                "mscale": 1.0,
                "mscale_all_dim": 1.0,
            },
        ),
        _correction_bias,
    ),
    "granite-moe-shared": lambda: _zoo_config(
        "GraniteMoeSharedConfig",
        "GraniteMoeSharedForCausalLM",
        num_local_experts=8,
        num_experts_per_tok=2,
        shared_intermediate_size=40,
        embedding_multiplier=3.0,
        residual_multiplier=0.5,
        attention_multiplier=0.2,
        logits_scaling=2.0,
    ),
}


def make_prompts(vocab_size: int, lengths: list[int], seed: int = 0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab_size, (n,), generator=g).tolist() for n in lengths]


@torch.inference_mode()
def hf_greedy(model, prompt: list[int], max_new_tokens: int) -> list[int]:
    """transformers' greedy continuation with its own KV cache, never stopping at EOS.

    A plain loop rather than `generate`, whose EOS handling (stop, or ban under
    min_new_tokens) would differ from `ignore_eos`."""
    out = model(torch.tensor([prompt]), use_cache=True)
    tokens = []
    for _ in range(max_new_tokens):
        nxt = int(out.logits[0, -1].argmax())
        tokens.append(nxt)
        out = model(torch.tensor([[nxt]]), past_key_values=out.past_key_values, use_cache=True)
    return tokens
