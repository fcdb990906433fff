"""The mixture-of-experts block (cadence/models/moe.py): routing as transformers does it,
the experts' sorted per-expert path equal to a plain loop over tokens and their chosen
experts, including experts that receive no token, and the shared expert's sigmoid gate.
(The families built on it run against transformers in test_zoo.py.)"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from cadence.models.moe import FusedExperts, MoEOptions, SparseMoE, route

H, INTER, E = 16, 24, 6


def plain_loop(x, experts: FusedExperts, ids, weights):
    """Token by token, chosen expert by chosen expert: what a mixture means."""
    out = torch.zeros_like(x)
    for t in range(x.shape[0]):
        for slot in range(ids.shape[1]):
            e = int(ids[t, slot])
            gate, up = F.linear(x[t], experts.w13_weight[e]).chunk(2)
            out[t] += weights[t, slot] * F.linear(F.silu(gate) * up, experts.w2_weight[e])
    return out


def random_experts(seed: int = 0) -> FusedExperts:
    torch.manual_seed(seed)
    experts = FusedExperts(E, H, INTER)
    experts.w13_weight.data.normal_()
    experts.w2_weight.data.normal_()
    return experts


@pytest.mark.parametrize("num_tokens", [1, 3, 17])
def test_sorted_experts_equal_a_plain_loop_even_where_experts_get_no_token(num_tokens):
    experts = random_experts()
    x = torch.randn(num_tokens, H)
    ids = torch.randint(0, E - 2, (num_tokens, 2))  # experts 4 and 5 never chosen
    ids[:, 1] = (ids[:, 0] + 1) % (E - 2)  # two distinct experts a token
    weights = torch.rand(num_tokens, 2)
    got = experts(x, ids, weights)
    torch.testing.assert_close(got, plain_loop(x, experts, ids, weights), atol=1e-4, rtol=1e-4)


def test_routing_takes_the_top_k_softmax_weights_and_renormalises_on_request():
    logits = torch.tensor([[0.0, 2.0, 1.0, -1.0]])
    weights, ids = route(logits, 2, renormalize=False)
    probs = torch.softmax(logits, -1)
    assert ids.tolist() == [[1, 2]]
    torch.testing.assert_close(weights, probs[:, [1, 2]])
    weights, _ = route(logits, 2, renormalize=True)
    torch.testing.assert_close(weights.sum(-1), torch.ones(1))
    assert weights.dtype == torch.float32


def test_the_shared_expert_adds_behind_a_sigmoid_gate():
    config = SimpleNamespace(hidden_size=H)
    options = MoEOptions(E, 2, INTER, renormalize=True, shared_intermediate_size=8)
    torch.manual_seed(1)
    moe = SparseMoE(config, options)
    for p in moe.parameters():
        p.data.normal_()
    x = torch.randn(5, H)
    weights, ids = route(moe.gate(x), 2, True)
    routed = plain_loop(x, moe.experts, ids, weights)
    shared = moe.shared_expert
    gate, up = shared.gate_up_proj(x).chunk(2, dim=-1)
    expected = routed + torch.sigmoid(moe.shared_expert_gate(x)) * shared.down_proj(
        F.silu(gate) * up
    )
    torch.testing.assert_close(moe(x), expected, atol=1e-4, rtol=1e-4)


def test_loading_an_expert_checks_names_and_shapes():
    experts = FusedExperts(E, H, INTER)
    experts.load_expert("w1", torch.ones(INTER, H), 0)
    with pytest.raises(ValueError, match="unexpected expert weight"):
        experts.load_expert("w9", torch.ones(INTER, H), 0)
    with pytest.raises(ValueError, match="unexpected expert weight"):
        experts.load_expert("w1", torch.ones(INTER, H), E)
    with pytest.raises(ValueError, match="does not fit"):
        experts.load_expert("w2", torch.ones(H + 1, INTER), 1)
    assert "expert 0 up" in experts.missing() and "expert 0 gate" not in experts.missing()


def test_transformers_5_stacked_expert_weights_load_as_per_expert_ones():
    torch.manual_seed(2)
    gate_up = torch.randn(E, 2 * INTER, H)
    down = torch.randn(E, H, INTER)
    stacked, single = FusedExperts(E, H, INTER), FusedExperts(E, H, INTER)
    stacked.load_stacked("gate_up_proj", gate_up)
    stacked.load_stacked("down_proj", down)
    for e in range(E):
        single.load_expert("gate_proj", gate_up[e, :INTER], e)
        single.load_expert("up_proj", gate_up[e, INTER:], e)
        single.load_expert("down_proj", down[e], e)
    assert stacked.missing() == [] == single.missing()
    torch.testing.assert_close(stacked.w13_weight, single.w13_weight)
    torch.testing.assert_close(stacked.w2_weight, single.w2_weight)


def test_experts_a_format_cannot_hold_are_refused_clearly():
    from cadence.quant.base import quant_scope
    from cadence.quant.fp8 import Fp8Quant, Fp8Scheme
    from cadence.quant.gguf import GgufQuant

    with quant_scope(GgufQuant()), pytest.raises(NotImplementedError, match="GGUF experts with"):
        FusedExperts(E, H, INTER, bias=True)  # GPT-OSS's: its GGUF layout is not read yet
    serialized = Fp8Quant(Fp8Scheme(serialized=True))
    with quant_scope(serialized), pytest.raises(NotImplementedError, match="FP8 checkpoints"):
        FusedExperts(E, H, INTER)


def test_fp8_experts_are_e4m3_per_row_and_track_the_16bit_ones():
    """`--quantization fp8`: once loaded, every expert's rows are e4m3 with a float32
    scale each, and the block's output moves by FP8 rounding only."""
    from cadence.quant.base import finish_loading, quant_scope
    from cadence.quant.fp8 import Fp8Quant

    plain = random_experts()
    with quant_scope(Fp8Quant()):
        fp8 = FusedExperts(E, H, INTER)
    fp8.load_state_dict(plain.state_dict())
    finish_loading(fp8)
    assert (
        fp8.w13_weight.dtype == torch.float8_e4m3fn and fp8.w2_weight.dtype == torch.float8_e4m3fn
    )
    assert fp8.w13_scale.shape == (E, 2 * INTER) and fp8.w2_scale.shape == (E, H)
    x = torch.randn(9, H)
    weights, ids = route(torch.randn(9, E), 2, True)
    want = plain(x, ids, weights)
    got = fp8(x, ids, weights)
    assert (got - want).abs().max() < 0.08 * want.abs().max()  # e4m3: 3 mantissa bits
    assert not torch.equal(got, want)


def test_grouped_sigmoid_routing_equals_transformers_router():
    """DeepSeek-V3's routing as GLM-4.5's router in transformers does it: 16 experts in 4
    groups, 2 groups eligible, a correction bias that steers the choice only."""
    from transformers import Glm4MoeConfig
    from transformers.models.glm4_moe.modeling_glm4_moe import Glm4MoeTopkRouter

    from cadence.models.moe import route_grouped

    config = Glm4MoeConfig(
        hidden_size=H, n_routed_experts=16, num_experts_per_tok=3, n_group=4, topk_group=2,
        routed_scaling_factor=1.8, norm_topk_prob=True,
    )  # fmt: skip
    torch.manual_seed(3)
    router = Glm4MoeTopkRouter(config)
    router.weight.data.normal_()
    router.e_score_correction_bias.normal_(0.0, 0.3)
    x = torch.randn(33, H)
    _, want_w, want_ids = router(x)
    logits = F.linear(x, router.weight)
    got_w, got_ids = route_grouped(logits, router.e_score_correction_bias, 3, 4, 2, True, 1.8)
    order_want, order_got = want_ids.sort(-1), got_ids.sort(-1)
    assert torch.equal(order_want.values, order_got.values)
    torch.testing.assert_close(
        got_w.gather(1, order_got.indices), want_w.gather(1, order_want.indices)
    )


def test_grouped_softmax_routing_equals_transformers_deepseek_v2_router():
    """DeepSeek-V2's group_limited_greedy: softmax scores, each group ranked by its best
    expert, 2 of 4 groups eligible, the weights scaled (not renormalised)."""
    from transformers import DeepseekV2Config
    from transformers.models.deepseek_v2.modeling_deepseek_v2 import DeepseekV2TopkRouter

    from cadence.models.moe import route_grouped

    config = DeepseekV2Config(
        hidden_size=H, n_routed_experts=16, num_experts_per_tok=3, n_group=4, topk_group=2,
        topk_method="group_limited_greedy", routed_scaling_factor=16.0, num_attention_heads=4,
    )  # fmt: skip
    torch.manual_seed(4)
    router = DeepseekV2TopkRouter(config)
    router.weight.data.normal_()
    x = torch.randn(33, H)
    _, want_w, want_ids = router(x)
    logits = F.linear(x, router.weight)
    got_w, got_ids = route_grouped(logits, None, 3, 4, 2, False, 16.0, scoring="softmax")
    order_want, order_got = want_ids.sort(-1), got_ids.sort(-1)
    assert torch.equal(order_want.values, order_got.values)
    torch.testing.assert_close(
        got_w.gather(1, order_got.indices), want_w.gather(1, order_want.indices)
    )
    # Groups matter here: the plain top 3 of the softmax differ for some token.
    assert not torch.equal(
        torch.softmax(logits, -1).topk(3).indices.sort(-1).values, got_ids.sort(-1).values
    )
