"""GGUF files of mixtures of experts, in llama.cpp's layout: Qwen3-MoE, Qwen2-MoE (a shared
expert behind its gate), Mixtral (stored as "llama", q/k rows permuted; its experts in
stacks, or one by one as older files hold them).

Each file is written here with gguf-py from a tiny transformers model: metadata under
llama.cpp's keys, the experts in [E, out, in] stacks of Q8_0 / Q4_0 blocks (the model then
takes the values the blocks hold), the routers float32. The config is read back from the
file as `cadence serve` reads it, and the engine must give transformers' greedy tokens,
from the blocks (each expert's own panels) and from the float path alike."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from model_helpers import ZOO, hf_greedy, make_prompts

from cadence import LLM, SamplingParams
from cadence.loader.gguf import SOURCE_FILE, read_config

gguf = pytest.importorskip("gguf")
Q8, Q4 = gguf.GGMLQuantizationType.Q8_0, gguf.GGMLQuantizationType.Q4_0

_ATTENTION = {
    "input_layernorm": "attn_norm",
    "post_attention_layernorm": "ffn_norm",
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "self_attn.q_norm": "attn_q_norm",
    "self_attn.k_norm": "attn_k_norm",
    "mlp.gate": "ffn_gate_inp",
    "mlp.shared_expert.gate_proj": "ffn_gate_shexp",
    "mlp.shared_expert.up_proj": "ffn_up_shexp",
    "mlp.shared_expert.down_proj": "ffn_down_shexp",
}


def _llama_cpp_permute(w: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's converter: each head's two rotary halves interleaved, row by row."""
    return (
        w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)
    )


class _File:
    """A GGUF file being written from a model; quantized tensors give the model back the
    values their blocks hold."""

    def __init__(self, path, arch: str) -> None:
        self.writer = gguf.GGUFWriter(str(path), arch)

    def add(self, name: str, data: np.ndarray, kind=None) -> np.ndarray:
        """Write `data` (float32, in Hugging Face's [.., out, in]); return what it holds."""
        if kind is None:
            self.writer.add_tensor(name, np.ascontiguousarray(data, dtype=np.float32))
            return data
        blocks = gguf.quants.quantize(np.ascontiguousarray(data, dtype=np.float32), kind)
        self.writer.add_tensor(name, blocks, raw_dtype=kind)
        return gguf.quants.dequantize(blocks, kind).reshape(data.shape)

    def close(self) -> None:
        self.writer.write_header_to_file()
        self.writer.write_kv_data_to_file()
        self.writer.write_tensors_to_file()
        self.writer.close()


def write_moe_gguf(model, arch: str, path, kinds: dict, legacy: bool = False) -> None:
    """`model` as llama.cpp writes `arch` ("llama" for Mixtral); `kinds`: the format of the
    gate, up and down stacks (None: float32); `legacy`: every expert's weights apart."""
    config = model.config
    f = _File(path, arch)
    meta = {
        "context_length": config.max_position_embeddings,
        "embedding_length": config.hidden_size,
        "block_count": config.num_hidden_layers,
        "feed_forward_length": config.intermediate_size,
        "attention.head_count": config.num_attention_heads,
        "attention.head_count_kv": config.num_key_value_heads,
        "vocab_size": config.vocab_size,
        "expert_count": getattr(config, "num_experts", None) or config.num_local_experts,
        "expert_used_count": config.num_experts_per_tok,
    }
    if arch != "llama":
        meta["expert_feed_forward_length"] = config.moe_intermediate_size
    if arch == "qwen2moe":
        meta["expert_shared_feed_forward_length"] = config.shared_expert_intermediate_size
    if arch == "qwen3moe":
        per_head = config.hidden_size // config.num_attention_heads
        meta["attention.key_length"] = getattr(config, "head_dim", None) or per_head
    for key, value in meta.items():
        f.writer.add_uint32(f"{arch}.{key}", value)
    f.writer.add_float32(f"{arch}.attention.layer_norm_rms_epsilon", config.rms_norm_eps)
    f.writer.add_float32(f"{arch}.rope.freq_base", config.rope_parameters["rope_theta"])
    state = model.state_dict()
    with torch.no_grad():
        for name, tensor in state.items():
            data = tensor.float().numpy()
            if name == "model.embed_tokens.weight":
                f.add("token_embd.weight", data)
                continue
            if name in ("model.norm.weight", "lm_head.weight"):
                f.add("output_norm.weight" if "norm" in name else "output.weight", data)
                continue
            _, _, layer, rest = name.split(".", 3)
            owner, _, suffix = rest.rpartition(".")
            blk = f"blk.{layer}"
            if rest in ("mlp.experts.gate_up_proj", "mlp.experts.down_proj"):
                held = _add_experts(f, blk, rest.rpartition(".")[2], data, kinds, legacy)
                tensor.copy_(torch.from_numpy(held))
                continue
            if owner == "mlp.shared_expert_gate":
                f.add(f"{blk}.ffn_gate_inp_shexp.weight", data[0])  # stored [H]
                continue
            if arch == "llama" and owner in ("self_attn.q_proj", "self_attn.k_proj"):
                heads = (
                    config.num_attention_heads if "q_proj" in owner else config.num_key_value_heads
                )
                data = _llama_cpp_permute(data, heads)
            f.add(f"{blk}.{_ATTENTION[owner]}.{suffix}", data)
    f.close()


def _add_experts(f: _File, blk: str, piece: str, data, kinds, legacy: bool) -> np.ndarray:
    """Write a stack ([E, 2I, H] gate|up, or [E, H, I] down) as llama.cpp's tensors;
    return the values they hold, in the same layout."""
    if piece == "down_proj":
        parts = {"ffn_down": data}
    else:
        half = data.shape[1] // 2
        parts = {"ffn_gate": data[:, :half], "ffn_up": data[:, half:]}
    held = []
    for stem, values in parts.items():
        kind = kinds[stem]
        if legacy:
            held.append(
                np.stack([f.add(f"{blk}.{stem}.{e}.weight", w, kind) for e, w in enumerate(values)])
            )
        else:
            held.append(f.add(f"{blk}.{stem}_exps.weight", values, kind))
    return np.concatenate(held, axis=1)


def _tiny(kind: str):
    config, cls = ZOO[kind]()
    if kind != "mixtral":
        config.moe_intermediate_size = 64  # whole blocks of 32 in the down stack's rows
    if kind == "qwen2-moe":
        config.mlp_only_layers = []  # (a file says nothing of dense layers in a mixture)
    torch.manual_seed(5)
    return cls(config).eval()


CASES = {
    # name: (tiny model, llama.cpp arch, gate / up / down formats, legacy per-expert tensors)
    "qwen3moe": ("qwen3-moe", "qwen3moe", {"ffn_gate": Q8, "ffn_up": Q4, "ffn_down": Q8}, False),
    "qwen2moe": ("qwen2-moe", "qwen2moe", {"ffn_gate": Q4, "ffn_up": Q4, "ffn_down": Q4}, False),
    "mixtral": ("mixtral", "llama", {"ffn_gate": Q4, "ffn_up": Q4, "ffn_down": Q8}, False),
    "mixtral-legacy": ("mixtral", "llama", {"ffn_gate": Q8, "ffn_up": Q8, "ffn_down": None}, True),
}


@pytest.fixture(scope="module", params=list(CASES))
def served(request, tmp_path_factory):
    """(case, the transformers model holding the blocks' values, the folder cadence serves)."""
    kind, arch, kinds, legacy = CASES[request.param]
    model = _tiny(kind)
    root = tmp_path_factory.mktemp(request.param)
    path = root / "model.gguf"
    write_moe_gguf(model, arch, path, kinds, legacy)
    config = read_config(path)  # as convert_gguf reads it
    folder = root / "converted"
    folder.mkdir()
    config.save_pretrained(folder)
    (folder / SOURCE_FILE).write_text(str(path))
    return request.param, model, folder


def _greedy(llm: LLM, prompts: list[list[int]], n: int) -> list[list[int]]:
    params = SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    return [o.outputs[0].token_ids for o in outs]


def test_the_config_read_from_the_file_is_the_models(served):
    name, model, folder = served
    config = read_config(folder.parent / "model.gguf")
    want = model.config
    assert type(config).__name__ == type(want).__name__  # Mixtral's "llama" file included
    fields = ["num_experts_per_tok", "num_hidden_layers", "hidden_size", "num_key_value_heads"]
    if name.startswith("mixtral"):
        fields += ["num_local_experts", "intermediate_size"]
    else:
        fields += ["num_experts", "moe_intermediate_size", "norm_topk_prob"]
    if name == "qwen2moe":
        fields.append("shared_expert_intermediate_size")
    for field in fields:
        assert getattr(config, field) == getattr(want, field), field


def test_blocks_serve_the_models_tokens(served):
    """Float32 activations on the file's blocks: every expert keeps its own kernels (no
    stack is expanded), and the tokens are transformers' in a mixed batch with chunked
    prefill."""
    _, model, folder = served
    prompts = make_prompts(512, [3, 37, 12, 60], seed=4)
    llm = LLM(str(folder), dtype="float32", quantization="gguf", skip_tokenizer_init=True,
              max_num_batched_tokens=32, kv_cache_memory=16 * 2**20)  # fmt: skip
    experts = llm.engine.runner.driver.model.layers[0].mlp.experts
    assert experts.w13_weight is None and len(experts.gguf_experts) == experts.num_experts
    assert _greedy(llm, prompts, 8) == [hf_greedy(model, p, 8) for p in prompts]


def test_the_float_path_serves_the_same_tokens(served):
    """`--quantization none`: the file expanded once to float32 safetensors (this reader,
    Mixtral's "llama" file included), loaded as a checkpoint's stacks."""
    _, model, folder = served
    prompts = make_prompts(512, [5, 29], seed=6)
    llm = LLM(str(folder), dtype="float32", quantization="none", skip_tokenizer_init=True,
              kv_cache_memory=16 * 2**20)  # fmt: skip
    assert (folder / "model.safetensors").exists()
    assert _greedy(llm, prompts, 6) == [hf_greedy(model, p, 6) for p in prompts]


def test_bf16_keeps_the_experts_packed(served):
    """The default on a CPU: bf16 activations on the blocks; the weights held stay near the
    file's size rather than the float stacks'."""
    _, model, folder = served
    llm = LLM(str(folder), skip_tokenizer_init=True, kv_cache_memory=16 * 2**20)
    assert llm.engine.runner.driver.model.layers[0].mlp.experts.quant_method.name == "gguf"
    out = _greedy(llm, make_prompts(512, [9], seed=8), 5)
    assert len(out[0]) == 5


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_blocks_on_a_gpu_expand_to_the_stacks_and_serve_the_models_tokens(served):
    """On CUDA the experts' blocks are expanded into the stacks the fused-MoE kernels read
    (float32 here), and the tokens are transformers' in a mixed batch."""
    _, model, folder = served
    prompts = make_prompts(512, [3, 37, 12], seed=4)
    llm = LLM(str(folder), device="cuda", dtype="float32", quantization="gguf",
              skip_tokenizer_init=True, max_num_batched_tokens=32,
              num_gpu_blocks_override=64)  # fmt: skip
    experts = llm.engine.runner.driver.model.layers[0].mlp.experts
    assert experts.w13_weight is not None and experts.w13_weight.is_cuda
    assert _greedy(llm, prompts, 8) == [hf_greedy(model, p, 8) for p in prompts]
