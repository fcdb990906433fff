"""SigLIP's vision tower: CLIP's encoder layers over patches without a class token, with
a final norm instead of a first one (Idefics3 / SmolVLM, LLaVA-OneVision, Gemma 3). Every
image is the tower's size, fully covered, so patch positions are plain and none is
masked."""

from __future__ import annotations

import torch
from torch import nn

from cadence.models.clip import CLIPEncoder


class SiglipEmbeddings(nn.Module):
    def __init__(self, config) -> None:
        super().__init__()
        patch = config.patch_size
        self.patch_embedding = nn.Conv2d(
            config.num_channels, config.hidden_size, patch, stride=patch
        )
        self.position_embedding = nn.Embedding(
            (config.image_size // patch) ** 2, config.hidden_size
        )

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        x = self.patch_embedding(pixels.to(self.patch_embedding.weight.dtype))
        return x.flatten(2).transpose(1, 2) + self.position_embedding.weight


class SiglipVisionTransformer(nn.Module):
    """`num_layers` built (a model reading an earlier layer's output needs no more), and the
    final norm only where the model reads the last layer's normed output."""

    def __init__(self, config, num_layers: int | None = None, final_norm: bool = True) -> None:
        super().__init__()
        self.embeddings = SiglipEmbeddings(config)
        self.encoder = CLIPEncoder(config, num_layers or config.num_hidden_layers)
        self.post_layernorm = None
        if final_norm:
            self.post_layernorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        """[tiles, 3, S, S] -> [tiles, patches, hidden]: the built layers' output, normed
        where the final norm was built."""
        x = self.embeddings(pixels)
        for layer in self.encoder.layers:
            x = layer(x)
        return x if self.post_layernorm is None else self.post_layernorm(x)
