"""The Llama family (Llama 2/3, SmolLM, Mistral-style configs), and the base that Qwen2 and
Qwen3 specialise: a decoder of pre-norm blocks with fused QKV and gate-up projections.

Differences between the families are constructor switches, not branches in forward:
    qkv_bias      Qwen2 (q/k/v projections carry a bias)
    qk_norm       Qwen3 (an RMSNorm over each head of q and k, before rotary)

Under tensor parallelism each rank builds the same model with its share of the heads and
of the MLP's columns (cadence/layers/linear.py says who holds what); the only
communication is inside the parallel layers (o_proj, down_proj, the embedding, logits).
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn

from cadence.attention.base import AttentionBackend, AttentionMetadata
from cadence.distributed.communication import all_reduce
from cadence.distributed.parallel_state import get_tp
from cadence.layers.activation import SiluAndMul
from cadence.layers.embedding import ParallelLMHead, VocabParallelEmbedding
from cadence.layers.linear import (
    ColumnParallelLinear,
    ColumnShard,
    RowParallelLinear,
    divide,
    shape_of,
)
from cadence.layers.norm import RMSNorm
from cadence.layers.rotary import RotaryEmbedding


class Attention(nn.Module):
    def __init__(
        self,
        config,
        backend: AttentionBackend,
        qkv_bias: bool,
        qk_norm: bool,
    ) -> None:
        super().__init__()
        total_heads = config.num_attention_heads
        total_kv_heads = getattr(config, "num_key_value_heads", None) or total_heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // total_heads
        # This rank's heads (all of them with one rank).
        self.num_heads = divide(total_heads, get_tp().size, "the number of attention heads")
        q_shard = ColumnShard.split(total_heads * self.head_dim, "the number of attention heads")
        kv_shard = ColumnShard.for_kv_heads(total_kv_heads, self.head_dim)
        self.num_kv_heads = kv_shard.count // self.head_dim
        self.q_size = q_shard.count
        self.kv_size = kv_shard.count
        self.scale = self.head_dim**-0.5
        bias = qkv_bias or bool(getattr(config, "attention_bias", False))
        self.qkv_proj = ColumnParallelLinear(
            config.hidden_size, [q_shard, kv_shard, kv_shard], bias=bias
        )
        self.o_proj = RowParallelLinear(
            total_heads * self.head_dim,
            config.hidden_size,
            bias=bool(getattr(config, "attention_bias", False)) and not qkv_bias,
            what="the number of attention heads",
        )
        self.q_norm = RMSNorm(self.head_dim, config.rms_norm_eps) if qk_norm else None
        self.k_norm = RMSNorm(self.head_dim, config.rms_norm_eps) if qk_norm else None
        self.backend = backend
        self.kv_cache: torch.Tensor | None = None  # bound by the model runner
        # An FP8 cache stores k / k_scale and v / v_scale: the checkpoint's scales where it
        # has them, else 1.0. Plain floats: they are constant once loaded (and a CUDA
        # graph keeps kernel arguments by value).
        self.kv_scale: tuple[float, float] = (1.0, 1.0)

    def forward(self, cos_sin, qkv: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        """Attention from the projected qkv [T, (Hq + 2 Hkv) * D] to o_proj's output."""
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = q.view(-1, self.num_heads, self.head_dim)
        k = k.view(-1, self.num_kv_heads, self.head_dim)
        v = v.view(-1, self.num_kv_heads, self.head_dim)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        # The backend rotates q and k (the Triton one while it writes K/V to the cache).
        out = self.backend.forward(q, k, v, self.kv_cache, meta, self.scale, cos_sin, self.kv_scale)
        out = out.reshape(-1, self.q_size)
        o = self.o_proj
        if (gemv := _batch1_gemv(out, o, "o")) is not None:
            return all_reduce(gemv.gemv(out, o.weight, o.local_bias))
        return o(out)


class MLP(nn.Module):
    def __init__(self, config) -> None:
        super().__init__()
        if getattr(config, "hidden_act", "silu") not in ("silu", "swish"):
            raise ValueError(f"unsupported activation {config.hidden_act!r}")
        bias = bool(getattr(config, "mlp_bias", False))
        inter = config.intermediate_size
        shard = ColumnShard.split(inter, "intermediate_size")
        self.gate_up_proj = ColumnParallelLinear(config.hidden_size, [shard, shard], bias=bias)
        self.down_proj = RowParallelLinear(inter, config.hidden_size, bias, "intermediate_size")
        self.act = SiluAndMul()

    def forward(self, gate_up: torch.Tensor) -> torch.Tensor:
        """down(silu(gate) * up) from the projected gate_up [T, 2 * intermediate]."""
        down = self.down_proj
        if (gemv := _batch1_gemv(gate_up, down, "down")) is not None:
            return all_reduce(gemv.silu_mul_gemv(gate_up, down.weight, down.local_bias))
        return down(self.act(gate_up))


class DecoderLayer(nn.Module):
    def __init__(self, config, backend, qkv_bias: bool, qk_norm: bool) -> None:
        super().__init__()
        self.self_attn = Attention(config, backend, qkv_bias, qk_norm)
        self.mlp = MLP(config)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(self, cos_sin, x, residual, meta):
        attn, mlp = self.self_attn, self.mlp
        qkv, residual = _norm_linear(x, residual, self.input_layernorm, attn.qkv_proj, "qkv")
        x = attn(cos_sin, qkv, meta)
        gate_up, residual = _norm_linear(
            x, residual, self.post_attention_layernorm, mlp.gate_up_proj, "gate_up"
        )
        return mlp(gate_up), residual


def _batch1_gemv(x: torch.Tensor, linear: nn.Module, projection: str):
    """cadence.ops.gemv when this projection takes its fused Triton kernels: a single
    row (batch-1 decode) of 16-bit activations on CUDA, a plain weight of their dtype (not
    a quantized one), and a projection in its FUSED_PROJECTIONS. None otherwise (the
    layer's own matmul and the separate elementwise kernels)."""
    if x.shape[0] != 1 or not x.is_cuda or x.dtype not in (torch.bfloat16, torch.float16):
        return None
    weight = linear.quant_method.plain_weight(linear)
    if (
        weight is None
        or weight.dtype != x.dtype
        or not (weight.is_contiguous() and x.is_contiguous())
    ):
        return None
    from cadence.ops import gemv

    return gemv if projection in gemv.FUSED_PROJECTIONS else None


def _norm_linear(x, residual, norm: RMSNorm, linear: ColumnParallelLinear, projection: str):
    """(linear(norm(x + residual)), x + residual); the first layer has no residual yet
    (then it is x). One kernel at batch 1 where the fused gemv serves."""
    if (gemv := _batch1_gemv(x, linear, projection)) is not None:
        return gemv.rms_norm_gemv(x, residual, norm.weight, norm.eps, linear.weight, linear.bias)
    if residual is None:
        residual, x = x, norm(x)
    else:
        x, residual = norm(x, residual)
    return linear(x), residual


def _kv_scale_of(name: str) -> tuple[int, str] | None:
    """(layer, "k" or "v") when a checkpoint name is a KV-cache scale: `self_attn.k_scale`
    / `v_scale` (compressed-tensors), or `k_proj.output_scale` / `v_proj.output_scale`."""
    parts = name.split(".")
    if len(parts) < 4 or parts[0] != "layers":
        return None
    tail = ".".join(parts[2:])
    for which in ("k", "v"):
        if tail in (f"self_attn.{which}_scale", f"self_attn.{which}_proj.output_scale"):
            return int(parts[1]), which
    return None


class LlamaForCausalLM(nn.Module):
    qkv_bias = False
    qk_norm = False

    def __init__(self, config, backend: AttentionBackend, max_position: int) -> None:
        super().__init__()
        self.config = config
        sliding = getattr(config, "sliding_window", None)
        if (
            sliding is not None
            and getattr(config, "use_sliding_window", True)
            and sliding < max_position
        ):
            raise ValueError(
                f"sliding-window attention (window {sliding}) is not supported; "
                f"run with max_model_len <= {sliding}"
            )
        head_dim = (
            getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        )
        self.rotary = RotaryEmbedding(config, head_dim, max_position)
        self.embed_tokens = VocabParallelEmbedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(
            DecoderLayer(config, backend, self.qkv_bias, self.qk_norm)
            for _ in range(config.num_hidden_layers)
        )
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.tie_word_embeddings = bool(getattr(config, "tie_word_embeddings", False))
        self.lm_head = (
            None
            if self.tie_word_embeddings
            else ParallelLMHead(config.vocab_size, config.hidden_size)
        )

    # EAGLE-3 drafts from the residual stream entering a few layers (keep_aux_hidden).
    aux_layer_ids: tuple[int, ...] = ()
    aux_hidden: list[torch.Tensor] | None = None  # [T, hidden] each, of the last forward

    def attention_layers(self) -> list[Attention]:
        return [layer.self_attn for layer in self.layers]

    def keep_aux_hidden(self, layer_ids: tuple[int, ...]) -> None:
        """From now on, each forward keeps the hidden state entering these layers (the
        residual stream: the previous layer's output) in `aux_hidden`, in this order."""
        bad = [i for i in layer_ids if not 0 <= i < len(self.layers)]
        if bad:
            raise ValueError(f"aux hidden-state layers {bad} outside 0..{len(self.layers) - 1}")
        self.aux_layer_ids = tuple(layer_ids)

    def forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata
    ) -> torch.Tensor:
        """Hidden states [T, hidden] for the step's tokens."""
        x = self.embed_tokens(input_ids)
        cos_sin = self.rotary.lookup(positions, x.dtype)
        residual = None
        kept: dict[int, torch.Tensor] = {}
        for i, layer in enumerate(self.layers):
            if i in self.aux_layer_ids:
                kept[i] = x if residual is None else x + residual
            x, residual = layer(cos_sin, x, residual, meta)
        if kept:
            self.aux_hidden = [kept[i] for i in self.aux_layer_ids]
        x, _ = self.norm(x, residual)
        return x

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Logits over the whole vocabulary (gathered from every rank's share)."""
        head = self.embed_tokens if self.lm_head is None else self.lm_head
        return head.logits(hidden)

    # ---- weights ----------------------------------------------------------------------

    # checkpoint name piece -> (our parameter name piece, shard index in the fused weight)
    _fused = {
        "q_proj": ("qkv_proj", 0),
        "k_proj": ("qkv_proj", 1),
        "v_proj": ("qkv_proj", 2),
        "gate_proj": ("gate_up_proj", 0),
        "up_proj": ("gate_up_proj", 1),
    }

    def load_weights(self, weights: Iterable[tuple[str, object]]) -> None:
        """Load (name, tensor or safetensors slice) pairs in the checkpoint's naming. Each
        parallel layer copies only its rank's rows or columns; others are replicated."""
        modules = dict(self.named_modules())
        params = dict(self.named_parameters())
        loaded: set[str] = set()
        for name, source in weights:
            name = name.removeprefix("model.")
            if "rotary_emb.inv_freq" in name:
                continue
            if name == "lm_head.weight" and self.lm_head is None:
                continue  # tied: the embedding serves
            if (kv := _kv_scale_of(name)) is not None:
                layer, which = kv
                attn = self.layers[layer].self_attn
                value = float(source[...] if shape_of(source) == () else source[:].max())
                k, v = attn.kv_scale
                attn.kv_scale = (value, v) if which == "k" else (k, value)
                continue
            shard = 0
            for piece, (fused, index) in self._fused.items():
                if f".{piece}." in name:
                    name, shard = name.replace(piece, fused), index
                    break
            owner, _, kind = name.rpartition(".")
            module = modules.get(owner)
            if name not in params or module is None:
                raise ValueError(f"unexpected weight {name!r} in the checkpoint")
            if hasattr(module, "load"):  # a parallel layer: it takes its own shard
                module.load(kind, source, shard)
            else:
                param = params[name]
                if shape_of(source) != tuple(param.shape):
                    raise ValueError(
                        f"{name}: checkpoint shape {shape_of(source)} != model's {tuple(param.shape)}"
                    )
                param.data.copy_(source[:])
            loaded.add(f"{name}#{shard}")
        missing = []
        for name in params:
            if name.rpartition(".")[2] not in ("weight", "bias"):
                continue  # a format's optional extras (scales) default where absent
            owner = modules[name.rpartition(".")[0]]
            shards = len(owner.shards) if isinstance(owner, ColumnParallelLinear) else 1
            missing += [name for i in range(shards) if f"{name}#{i}" not in loaded]
        if missing:
            raise ValueError(
                f"checkpoint lacks weights: {missing[:5]}{' …' if len(missing) > 5 else ''}"
            )
