"""Write a GGUF file of a mixture of experts with random weights, in llama.cpp's qwen3moe
layout, for the CPU comparison against llama.cpp (benchmarks/cpu_llamacpp.sh with
MODEL=<this file>): every linear weight in Q4_0 blocks (the experts as
`ffn_{gate,up,down}_exps` stacks), norms and routers float32, and SmolLM2's tokenizer
copied from the default model's file so both servers can read it.

The default shape is Qwen3-30B-A3B scaled down to what a small machine holds: hidden
1,024, 16 layers of 64 experts of 384 (top 8), 16 query and 4 KV heads of 64, SmolLM2's
49,152-token vocabulary. 1.3 B parameters, 0.24 B of them active per token; ~0.8 GB.

    python benchmarks/gguf_moe_file.py OUT.gguf [--layers 16 --experts 64 ...]
"""

from __future__ import annotations

import argparse

import gguf
import numpy as np

from cadence.loader.gguf import default_model_path

Q4_0 = gguf.GGMLQuantizationType.Q4_0


def _copy_tokenizer(writer: gguf.GGUFWriter, source: str) -> int:
    """Every `tokenizer.*` field of `source` into `writer`; return the vocabulary's size."""
    reader = gguf.GGUFReader(source)
    vocab = 0
    for name, field in reader.fields.items():
        if not name.startswith("tokenizer."):
            continue
        kind = field.types[0]
        if kind == gguf.GGUFValueType.ARRAY:
            values = field.contents()
            writer.add_key_value(name, values, kind, sub_type=field.types[-1])
            if name == "tokenizer.ggml.tokens":
                vocab = len(values)
        else:
            writer.add_key_value(name, field.contents(), kind)
    return vocab


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--experts", type=int, default=64)
    ap.add_argument("--expert-width", type=int, default=384)
    ap.add_argument("--top-k", type=int, default=8)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--kv-heads", type=int, default=4)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    arch, rng = "qwen3moe", np.random.default_rng(args.seed)
    writer = gguf.GGUFWriter(args.out, arch)
    writer.add_name("random-qwen3moe")
    vocab = _copy_tokenizer(writer, default_model_path())
    h, width, d = args.hidden, args.expert_width, args.head_dim
    for key, value in {
        "context_length": 4096,
        "embedding_length": h,
        "block_count": args.layers,
        "feed_forward_length": 4 * h,
        "attention.head_count": args.heads,
        "attention.head_count_kv": args.kv_heads,
        "attention.key_length": d,
        "attention.value_length": d,
        "expert_count": args.experts,
        "expert_used_count": args.top_k,
        "expert_feed_forward_length": width,
        "vocab_size": vocab,
    }.items():
        writer.add_uint32(f"{arch}.{key}", value)
    writer.add_float32(f"{arch}.attention.layer_norm_rms_epsilon", 1e-6)
    writer.add_float32(f"{arch}.rope.freq_base", 1e6)

    def weight(name: str, *shape: int, scale: float = 0.02) -> None:  # [.., out, in], Q4_0
        data = rng.standard_normal(shape, dtype=np.float32) * scale
        writer.add_tensor(name, gguf.quants.quantize(data, Q4_0), raw_dtype=Q4_0)

    def ones(name: str, n: int) -> None:
        writer.add_tensor(name, np.ones(n, dtype=np.float32))

    weight("token_embd.weight", vocab, h)
    ones("output_norm.weight", h)
    weight("output.weight", vocab, h)
    for i in range(args.layers):
        b = f"blk.{i}"
        ones(f"{b}.attn_norm.weight", h)
        ones(f"{b}.ffn_norm.weight", h)
        ones(f"{b}.attn_q_norm.weight", d)
        ones(f"{b}.attn_k_norm.weight", d)
        weight(f"{b}.attn_q.weight", args.heads * d, h)
        weight(f"{b}.attn_k.weight", args.kv_heads * d, h)
        weight(f"{b}.attn_v.weight", args.kv_heads * d, h)
        weight(f"{b}.attn_output.weight", h, args.heads * d)
        router = rng.standard_normal((args.experts, h), dtype=np.float32)
        writer.add_tensor(f"{b}.ffn_gate_inp.weight", router)
        weight(f"{b}.ffn_gate_exps.weight", args.experts, width, h)
        weight(f"{b}.ffn_up_exps.weight", args.experts, width, h)
        weight(f"{b}.ffn_down_exps.weight", args.experts, h, width)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
