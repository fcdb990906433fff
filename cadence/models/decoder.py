"""The decoder every family is: embedding, a stack of layers, a final norm, logits.

A family file subclasses `DecoderForCausalLM` and says only how its blocks are arranged:
which layer kind (how norms and residuals wrap attention and the MLP), its attention's
options per layer, its norm and MLP, the embedding and logit scales, and how its checkpoint
names map onto ours. Layer kinds:

    PreNormLayer    x + attn(norm(x)), then + mlp(norm(.))   Llama, Qwen, Mistral, Phi-3, ...
    SandwichLayer   norms before and after each block        Gemma 2, Gemma 3
    PostNormLayer   x + norm(attn(x)), then + norm(mlp(.))   OLMo 2
    ParallelLayer   x + attn(norm(x)) + mlp(norm(x))         Cohere

A layer's output is a pair (x, residual) whose sum is the hidden state (residual None: x is
all of it), so pre-norm layers fuse each residual add into the next norm. A mixture of
experts (models/moe.py) takes a pre-norm layer's MLP place: it is handed the normed hidden
state itself, not a projection of it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace
from typing import TYPE_CHECKING

import torch
from torch import nn

from cadence.attention.base import AttentionBackend, AttentionMetadata
from cadence.layers.embedding import ParallelLMHead, VocabParallelEmbedding
from cadence.layers.norm import RMSNorm, post_norm_add_norm
from cadence.layers.rotary import RotaryEmbedding
from cadence.models.attention import Attention, AttentionOptions, head_dim_of
from cadence.models.fused import norm_linear, norm_router
from cadence.models.mlp import GatedMLP
from cadence.models.moe import SparseMoE
from cadence.models.weights import load_checkpoint

if TYPE_CHECKING:
    from cadence.models.vision_language import ImageRows


class _Layer(nn.Module):
    """One layer's attention and MLP, and the norms its kind names (`norms`), each made by
    the family's make_norm over the hidden size."""

    norms: tuple[str, ...] = ()

    def __init__(self, attn: Attention, mlp: nn.Module, make_norm, hidden: int) -> None:
        super().__init__()
        self.self_attn = attn
        self.mlp = mlp
        for name in self.norms:
            setattr(self, name, make_norm(hidden))


class PreNormLayer(_Layer):
    """`residual_scale` (Granite) multiplies each block's output before its residual add."""

    norms = ("input_layernorm", "post_attention_layernorm")
    residual_scale = 1.0

    def forward(self, cos_sin, x, residual, meta):
        attn, mlp = self.self_attn, self.mlp
        qkv, residual = norm_linear(x, residual, self.input_layernorm, attn.qkv_proj, "qkv")
        x = attn(cos_sin, qkv, meta)
        if self.residual_scale != 1.0:
            x = x * self.residual_scale
        if isinstance(mlp, SparseMoE):  # a mixture routes the normed hidden state itself
            logits, x, residual = norm_router(x, residual, self.post_attention_layernorm, mlp.gate)
            x = mlp(x, logits)
        else:
            gate_up, residual = norm_linear(
                x, residual, self.post_attention_layernorm, mlp.gate_up_proj, "gate_up"
            )
            x = mlp(gate_up)
        if self.residual_scale != 1.0:
            x = x * self.residual_scale
        return x, residual


class SandwichLayer(_Layer):
    norms = (
        "input_layernorm",
        "post_attention_layernorm",
        "pre_feedforward_layernorm",
        "post_feedforward_layernorm",
    )

    def forward(self, cos_sin, x, residual, meta):
        attn, mlp = self.self_attn, self.mlp
        qkv, residual = norm_linear(x, residual, self.input_layernorm, attn.qkv_proj, "qkv")
        x, residual = post_norm_add_norm(
            attn(cos_sin, qkv, meta),
            residual,
            self.post_attention_layernorm,
            self.pre_feedforward_layernorm,
        )
        return self.post_feedforward_layernorm(mlp(mlp.gate_up_proj(x))), residual


class PostNormLayer(_Layer):
    norms = ("post_attention_layernorm", "post_feedforward_layernorm")

    def forward(self, cos_sin, x, residual, meta):
        h = x if residual is None else x + residual
        attn, mlp = self.self_attn, self.mlp
        h = h + self.post_attention_layernorm(attn(cos_sin, attn.qkv_proj(h), meta))
        return self.post_feedforward_layernorm(mlp(mlp.gate_up_proj(h))), h


class ParallelLayer(_Layer):
    norms = ("input_layernorm",)

    def forward(self, cos_sin, x, residual, meta):
        h = x if residual is None else x + residual
        normed = self.input_layernorm(h)
        attn, mlp = self.self_attn, self.mlp
        out = attn(cos_sin, attn.qkv_proj(normed), meta) + mlp(mlp.gate_up_proj(normed))
        return out, h


class DecoderForCausalLM(nn.Module):
    """The family-independent model. Subclasses override the hooks below; every hook has
    Llama's answer."""

    layer_kind: type[nn.Module] = PreNormLayer
    # checkpoint name piece -> (our parameter name piece, shard index in the fused weight)
    fused_names: dict[str, tuple[str, int]] = {
        "q_proj": ("qkv_proj", 0),
        "k_proj": ("qkv_proj", 1),
        "v_proj": ("qkv_proj", 2),
        "gate_proj": ("gate_up_proj", 0),
        "up_proj": ("gate_up_proj", 1),
    }
    # projections a checkpoint stores already fused (Phi-3's qkv_proj, named as ours): the
    # rows are split into our shards on load (models/weights.py)
    prefused_names: frozenset[str] = frozenset()

    # ---- the family's hooks --------------------------------------------------------------

    def attention_options(self, config, layer: int) -> AttentionOptions:
        rotary_dim = rotary_dim_of(config)
        return AttentionOptions(
            qkv_bias=bool(getattr(config, "attention_bias", False)),
            o_bias=bool(getattr(config, "attention_bias", False)),
            rotary_dim=None if rotary_dim == head_dim_of(config) else rotary_dim,
            window=layer_window(config, layer),
        )

    def make_attention(self, config, backend: AttentionBackend, layer: int) -> nn.Module:
        """The layer's attention block: `Attention` with the family's options (the model
        caps a window at max_position first). A block of another kind (DeepSeek's latent
        attention) has the same face: `qkv_proj`, forward(cos_sin, qkv, meta), and the
        cache attributes worker/kv_tensors.py binds."""
        return Attention(config, backend, self._options(config, layer, self.max_position))

    def make_norm(self, config, size: int) -> nn.Module:
        return RMSNorm(size, config.rms_norm_eps)

    def make_mlp(self, config, layer: int) -> nn.Module:
        return GatedMLP(config, bias=bool(getattr(config, "mlp_bias", False)))

    def rotary_tables(self, config, max_position: int) -> dict[str, RotaryEmbedding]:
        """kind -> table; layers read theirs by AttentionOptions.rotary_kind."""
        return {"global": RotaryEmbedding(config, rotary_dim_of(config), max_position)}

    def embedding_scale(self, config) -> float | None:
        return None

    def finish_logits(self, logits: torch.Tensor) -> torch.Tensor:
        return logits

    # ---- the model -----------------------------------------------------------------------

    def __init__(self, config, backend: AttentionBackend, max_position: int) -> None:
        super().__init__()
        self.config = config
        self.max_position = max_position
        self.rotary = nn.ModuleDict(self.rotary_tables(config, max_position))
        self.embed_tokens = VocabParallelEmbedding(config.vocab_size, config.hidden_size)
        self.embed_scale = self.embedding_scale(config)
        self._embed_scale_as: dict[torch.dtype, float] = {}  # rounded to each dtype once
        hidden = config.hidden_size
        self.layers = nn.ModuleList(
            self.layer_kind(
                self.make_attention(config, backend, i),
                self.make_mlp(config, i),
                lambda size: self.make_norm(config, size),
                hidden,
            )
            for i in range(config.num_hidden_layers)
        )
        self.norm = self.make_norm(config, hidden)
        self.tie_word_embeddings = bool(getattr(config, "tie_word_embeddings", False))
        self.lm_head = (
            None if self.tie_word_embeddings else ParallelLMHead(config.vocab_size, hidden)
        )

    def _options(self, config, layer: int, max_position: int) -> AttentionOptions:
        options = self.attention_options(config, layer)
        if options.window is not None and options.window >= max_position:
            options = replace(options, window=None)  # no sequence is longer than the window
        return options

    # A vision-language model's (models/vision_language.py): its image placeholder token,
    # whether its rotary positions are three-dimensional (M-RoPE) and whether an image's
    # tokens attend to each other both ways (Gemma 3); a text model's: none.
    image_token_id: int | None = None
    uses_mrope = False
    bidirectional_images = False

    # EAGLE-3 drafts from the residual stream entering a few layers (keep_aux_hidden).
    aux_layer_ids: tuple[int, ...] = ()
    aux_hidden: list[torch.Tensor] | None = None  # [T, hidden] each, of the last forward

    def attention_layers(self) -> list[nn.Module]:
        return [layer.self_attn for layer in self.layers]

    def keep_aux_hidden(self, layer_ids: tuple[int, ...]) -> None:
        """From now on, each forward keeps the hidden state entering these layers (the
        residual stream: the previous layer's output) in `aux_hidden`, in this order."""
        bad = [i for i in layer_ids if not 0 <= i < len(self.layers)]
        if bad:
            raise ValueError(f"aux hidden-state layers {bad} outside 0..{len(self.layers) - 1}")
        self.aux_layer_ids = tuple(layer_ids)

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        meta: AttentionMetadata,
        images: ImageRows | None = None,
    ) -> torch.Tensor:
        """Hidden states [T, hidden] for the step's tokens. `images`: a vision encoder's
        output, which replaces those rows' token embeddings (after the text embeddings'
        scale, which images do not take), and M-RoPE positions where the family has them."""
        x = self.embed_tokens(input_ids)
        if self.embed_scale is not None:  # rounded to the activations' dtype first, as HF
            scale = self._embed_scale_as.get(x.dtype)
            if scale is None:
                scale = float(torch.tensor(self.embed_scale, dtype=x.dtype))
                self._embed_scale_as[x.dtype] = scale
            x = x * scale
        if images is not None:
            x = x.index_copy(0, images.rows, images.embeds.to(x.dtype))
            if images.positions is not None:
                positions = images.positions
        cos_sin = {kind: table.lookup(positions, x.dtype) for kind, table in self.rotary.items()}
        residual = None
        kept: dict[int, torch.Tensor] = {}
        for i, layer in enumerate(self.layers):
            if i in self.aux_layer_ids:
                kept[i] = x if residual is None else x + residual
            x, residual = layer(cos_sin, x, residual, meta)
        if kept:
            self.aux_hidden = [kept[i] for i in self.aux_layer_ids]
        x = self.norm(x) if residual is None else self.norm(x, residual)[0]
        return x

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Logits over the whole vocabulary (gathered from every rank's share)."""
        head = self.embed_tokens if self.lm_head is None else self.lm_head
        return self.finish_logits(head.logits(hidden))

    def checkpoint_name(self, name: str) -> str | None:
        """Our name for a checkpoint tensor's (after `model.` is dropped); None: skip it."""
        return name

    def load_weights(self, weights: Iterable[tuple[str, object]]) -> None:
        """Load (name, tensor or safetensors slice) pairs in the checkpoint's naming."""
        load_checkpoint(self, weights)


def rotary_dim_of(config) -> int:
    """The leading dims of each head that rotate (`partial_rotary_factor` of the head)."""
    params = getattr(config, "rope_parameters", None) or {}
    factor = params.get("partial_rotary_factor", getattr(config, "partial_rotary_factor", 1.0))
    return int(head_dim_of(config) * (factor or 1.0))


def layer_window(config, layer: int) -> int | None:
    """The sliding window of `layer`, from the config's conventions: `layer_types`
    ("sliding_attention"), else `use_sliding_window` with `max_window_layers` (Qwen2: layers
    from that index on slide), else `sliding_window` alone (Mistral, Starcoder2)."""
    window = getattr(config, "sliding_window", None)
    if window is None:
        return None
    types = getattr(config, "layer_types", None)
    if types is not None:
        return window if types[layer] == "sliding_attention" else None
    if not getattr(config, "use_sliding_window", True):
        return None
    first = getattr(config, "max_window_layers", None)
    if first is not None and hasattr(config, "use_sliding_window") and layer < first:
        return None
    return window
