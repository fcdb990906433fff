"""CLIP's vision transformer (LLaVA's image encoder): patches and a class token, learned
positions, pre-norm layers of full attention over one image's tokens.

Names follow the checkpoints (`embeddings.patch_embedding`, `encoder.layers.N.self_attn
.q_proj`, `pre_layrnorm` with its historical spelling), so the loader fills it as it is.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from cadence.models.vision_layers import StackedLinear, activation


class CLIPVisionEmbeddings(nn.Module):
    def __init__(self, config) -> None:
        super().__init__()
        hidden, patch = config.hidden_size, config.patch_size
        self.patch_embedding = nn.Conv2d(
            config.num_channels, hidden, kernel_size=patch, stride=patch, bias=False
        )
        self.class_embedding = nn.Parameter(torch.empty(hidden))
        num_positions = (config.image_size // patch) ** 2 + 1
        self.position_embedding = nn.Embedding(num_positions, hidden)

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        """[B, 3, H, W] -> [B, 1 + patches, hidden]"""
        dtype = self.patch_embedding.weight.dtype
        patches = self.patch_embedding(pixels.to(dtype)).flatten(2).transpose(1, 2)
        cls = self.class_embedding.expand(patches.shape[0], 1, -1)
        x = torch.cat([cls, patches], dim=1)
        if x.shape[1] != self.position_embedding.num_embeddings:
            raise ValueError(
                f"an image of {x.shape[1] - 1} patches; this encoder takes "
                f"{self.position_embedding.num_embeddings - 1}"
            )
        return x + self.position_embedding.weight


class CLIPAttention(nn.Module):
    def __init__(self, config) -> None:
        super().__init__()
        hidden = config.hidden_size
        self.num_heads = config.num_attention_heads
        self.qkv_proj = StackedLinear(hidden, [hidden] * 3)
        self.out_proj = nn.Linear(hidden, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, h = x.shape
        q, k, v = (
            t.view(b, s, self.num_heads, -1).transpose(1, 2)
            for t in self.qkv_proj(x).chunk(3, dim=-1)
        )
        out = F.scaled_dot_product_attention(q, k, v)  # every patch sees every patch
        return self.out_proj(out.transpose(1, 2).reshape(b, s, h))


class CLIPMLP(nn.Module):
    def __init__(self, config) -> None:
        super().__init__()
        self.act = activation(config.hidden_act)
        self.fc1 = nn.Linear(config.hidden_size, config.intermediate_size)
        self.fc2 = nn.Linear(config.intermediate_size, config.hidden_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))


class CLIPEncoderLayer(nn.Module):
    def __init__(self, config) -> None:
        super().__init__()
        self.layer_norm1 = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.self_attn = CLIPAttention(config)
        self.layer_norm2 = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.mlp = CLIPMLP(config)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn(self.layer_norm1(x))
        return x + self.mlp(self.layer_norm2(x))


class CLIPEncoder(nn.Module):
    def __init__(self, config, num_layers: int) -> None:
        super().__init__()
        self.layers = nn.ModuleList(CLIPEncoderLayer(config) for _ in range(num_layers))


class CLIPVisionTransformer(nn.Module):
    """`num_layers`: the layers built (a model that reads an earlier layer's output needs
    no more; the checkpoint's later layers are skipped at load)."""

    def __init__(self, config, num_layers: int) -> None:
        super().__init__()
        self.embeddings = CLIPVisionEmbeddings(config)
        self.pre_layrnorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.encoder = CLIPEncoder(config, num_layers)

    def hidden_states(self, pixels: torch.Tensor, wanted: list[int]) -> list[torch.Tensor]:
        """The hidden states after `wanted` layers each (0: the embeddings, normed), in
        that order: [B, 1 + patches, hidden] each."""
        x = self.pre_layrnorm(self.embeddings(pixels))
        states = {0: x}
        for i, layer in enumerate(self.encoder.layers[: max(wanted)]):
            x = layer(x)
            states[i + 1] = x
        return [states[i] for i in wanted]
