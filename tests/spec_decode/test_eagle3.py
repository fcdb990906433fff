"""EAGLE-3 heads: a random head saved in the public checkpoint format loads, and its
proposals are those of an independent reading of the format (plain torch over
transformers' hidden states: fc of three layers' inputs, the embedding of the next token
beside the hidden state, one decoder layer, d2t to target ids)."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F
from model_helpers import make_prompts
from safetensors.torch import load_file, save_file
from spec_helpers import eagle3_head

from cadence import LLM, SamplingParams

K = 3


def rms(x, w, eps=1e-6):
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def rotate(x, positions, theta=10000.0):
    d = x.shape[-1]
    inv = 1.0 / (theta ** (torch.arange(0, d, 2).float() / d))
    freqs = positions[:, None].float() * inv
    emb = torch.cat([freqs, freqs], dim=-1)
    cos, sin = emb.cos()[:, None], emb.sin()[:, None]
    half = torch.cat([-x[..., d // 2 :], x[..., : d // 2]], dim=-1)
    return x * cos + half * sin


class ReferenceHead:
    """The head over whole sequences, no cache: rows are positions 0..n-1."""

    def __init__(self, path, embed):
        self.w = load_file(f"{path}/model.safetensors")
        self.embed = embed

    def layer(self, tokens, hidden, positions):
        w = self.w
        x = torch.cat(
            [
                rms(self.embed(tokens), w["midlayer.input_layernorm.weight"]),
                rms(hidden, w["midlayer.hidden_norm.weight"]),
            ],
            dim=-1,
        )
        q = (x @ w["midlayer.self_attn.q_proj.weight"].T).view(len(tokens), 4, 16)
        k = (x @ w["midlayer.self_attn.k_proj.weight"].T).view(len(tokens), 2, 16)
        v = (x @ w["midlayer.self_attn.v_proj.weight"].T).view(len(tokens), 2, 16)
        q, k = rotate(q, positions), rotate(k, positions)
        k, v = k.repeat_interleave(2, dim=1), v.repeat_interleave(2, dim=1)
        att = F.scaled_dot_product_attention(
            q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), is_causal=True
        ).transpose(0, 1)
        x2 = att.reshape(len(tokens), 64) @ w["midlayer.self_attn.o_proj.weight"].T + hidden
        n2 = rms(x2, w["midlayer.post_attention_layernorm.weight"])
        gate, up = (
            n2 @ w["midlayer.mlp.gate_proj.weight"].T,
            n2 @ w["midlayer.mlp.up_proj.weight"].T,
        )
        x3 = (F.silu(gate) * up) @ w["midlayer.mlp.down_proj.weight"].T + x2
        draft = (rms(x3, w["norm.weight"]) @ w["lm_head.weight"].T).argmax(-1)
        return x3, draft + w["d2t"][draft]

    def propose(self, aux, tokens, k):
        """aux [n, 3H] for positions 0..n-1; tokens: n + 1 known tokens."""
        n = len(tokens) - 1
        hidden = aux @ self.w["fc.weight"].T
        toks = torch.tensor(tokens[1:])
        out = []
        for _ in range(k):
            x3, guess = self.layer(toks, hidden, torch.arange(len(toks)))
            out.append(int(guess[-1]))
            hidden = torch.cat([hidden, x3[-1:]])
            toks = torch.cat([toks, guess[-1:]])
        assert len(toks) == n + k
        return out


@torch.inference_mode()
def test_proposals_follow_the_public_format(tiny_model_dir, hf_model, tmp_path):
    target = tiny_model_dir("llama")
    head = eagle3_head(tmp_path / "head")
    llm = LLM(
        target,
        dtype="float32",
        speculative_config={"method": "eagle3", "model": head, "num_speculative_tokens": K},
    )
    assert llm.engine.runner.driver.model.aux_layer_ids == (0, 1, 1)  # from eagle_config
    prompt = make_prompts(512, [21], seed=5)[0]
    params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    llm.engine.add_request("r", prompt, params)
    llm.engine.step()  # the prompt's prefill: samples a token, proposes K
    req = llm.engine.scheduler.requests["r"]
    model = hf_model(target)
    tokens = req.all_token_ids
    out = model(torch.tensor([tokens[:-1]]), output_hidden_states=True)
    hs = out.hidden_states  # [i]: the residual stream entering layer i
    aux = torch.cat([hs[0][0], hs[1][0], hs[1][0]], dim=-1)
    ref = ReferenceHead(head, model.get_input_embeddings())
    assert req.spec_token_ids == ref.propose(aux, tokens, K)
    assert all(t % 2 == 0 for t in req.spec_token_ids)  # d2t maps draft i to target 2 i


def test_a_head_missing_a_weight_is_refused_by_name(tiny_model_dir, tmp_path):
    head = eagle3_head(tmp_path / "head")
    weights = load_file(f"{head}/model.safetensors")
    del weights["midlayer.hidden_norm.weight"]
    save_file(weights, f"{head}/model.safetensors")
    spec = {"method": "eagle3", "model": head, "num_speculative_tokens": 2}
    with pytest.raises(ValueError, match="hidden_norm"):
        LLM(tiny_model_dir("llama"), dtype="float32", speculative_config=spec)


def test_default_layers_when_the_config_names_none(tiny_model_dir, tmp_path):
    head = eagle3_head(tmp_path / "head")
    cfg = json.loads((tmp_path / "head" / "config.json").read_text())
    del cfg["eagle_config"]
    (tmp_path / "head" / "config.json").write_text(json.dumps(cfg))
    spec = {"method": "eagle3", "model": head, "num_speculative_tokens": 2}
    llm = LLM(tiny_model_dir("llama"), dtype="float32", speculative_config=spec)
    assert llm.engine.runner.driver.model.aux_layer_ids == (
        0,
        1,
        1,
    )  # 2 layers: first, middle, last
