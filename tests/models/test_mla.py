"""Multi-head latent attention (DeepSeek-V2/V3): the pool keeps one latent per token and
layer, not every head's K and V; the score scale follows transformers' (YaRN's mscale
included); what cannot handle a latent cache says so. (Greedy equality with transformers,
chunked, preempted and cached, is the zoo's test: tests/models/test_zoo.py.)"""

from __future__ import annotations

import pytest
import torch
from model_helpers import build_tiny

from cadence import LLM
from cadence.models.mla import latent_kv_dim, latent_scale
from cadence.worker.kv_tensors import kv_bytes_per_block


@pytest.mark.parametrize("kind", ["deepseek-v2", "deepseek-v3"])
def test_the_pool_holds_one_latent_per_token_and_layer(kind, tiny_model_dir):
    llm = LLM(tiny_model_dir(kind), dtype="float32", num_gpu_blocks_override=16, block_size=4)
    runner = llm.engine.runner.driver
    config = runner.model.config
    width = config.kv_lora_rank + config.qk_rope_head_dim  # 32 + 16
    assert latent_kv_dim(config) == width
    assert [tuple(c.shape) for c in runner.kv_caches] == [(1, 16, 4, 1, width)] * 3
    for layer, cache in zip(runner.model.attention_layers(), runner.kv_caches):
        # the backends see K and V halves; both are the one latent tensor
        assert layer.kv_cache.shape == (2, 16, 4, 1, width)
        assert layer.kv_cache[0].data_ptr() == layer.kv_cache[1].data_ptr() == cache.data_ptr()
    # 3 layers x 4 tokens x 48 floats: against 2 x 4 heads x (16 + 16) expanded K/V per token
    assert kv_bytes_per_block(runner.model, 4, torch.float32) == 3 * 4 * width * 4


@pytest.mark.parametrize("kind", ["deepseek-v2", "deepseek-v3"])
def test_score_scale_equals_transformers(kind):
    config, _ = build_tiny(kind)
    module = {
        "deepseek-v2": "transformers.models.deepseek_v2.modeling_deepseek_v2",
        "deepseek-v3": "transformers.models.deepseek_v3.modeling_deepseek_v3",
    }[kind]
    import importlib

    attention = getattr(importlib.import_module(module), f"Deepseek{kind[-2:].upper()}Attention")
    want = attention(config, 0).scaling
    assert latent_scale(config) == pytest.approx(want, rel=1e-12)
    assert want != pytest.approx((16 + 16) ** -0.5)  # YaRN's mscale_all_dim scales it


def test_kv_transfer_refuses_a_latent_cache():
    from cadence.kv_transfer.connector import KVLayers

    with pytest.raises(ValueError, match="latent"):
        KVLayers([torch.zeros(1, 4, 4, 1, 40)], block_size=4)


@pytest.mark.parametrize(
    ("kind", "change", "error"),
    [
        ("deepseek-v2", {"topk_method": "noaux_tc"}, "topk_method='noaux_tc'"),
        ("deepseek-v2", {"scoring_func": "sigmoid"}, "scoring_func='sigmoid'"),
        ("deepseek-v3", {"scoring_func": "softmax"}, "scoring_func='softmax'"),
        ("deepseek-v2", {"moe_layer_freq": 2}, "moe_layer_freq=2"),
        ("deepseek-v2", {"attention_bias": True}, "needs a q_lora_rank"),
    ],
)
def test_what_would_route_or_load_differently_is_refused(kind, change, error):
    from cadence.attention.torch_ref import TorchAttentionBackend
    from cadence.models.deepseek import DeepseekV2ForCausalLM, DeepseekV3ForCausalLM

    config, _ = build_tiny(kind)
    for name, value in change.items():
        setattr(config, name, value)
    cls = DeepseekV3ForCausalLM if kind == "deepseek-v3" else DeepseekV2ForCausalLM
    with pytest.raises(ValueError, match=error):
        cls(config, TorchAttentionBackend(), 64)


def test_kv_cache_scales_are_refused_for_a_latent_cache():
    from cadence.attention.torch_ref import TorchAttentionBackend
    from cadence.models.mla import LatentAttention

    config, _ = build_tiny("deepseek-v3")
    layer = LatentAttention(config, TorchAttentionBackend(), interleaved=False)
    layer.kv_scale = (1.0, 1.0)  # what a checkpoint without scales leaves
    with pytest.raises(ValueError, match="latent"):
        layer.kv_scale = (0.5, 1.0)
