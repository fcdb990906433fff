"""Gemma 3 with images: a SigLIP tower (models/siglip.py, its final norm kept) over the
image at the tower's size, its patch grid average-pooled down to `mm_tokens_per_image`
tokens, each normed (Gemma's RMSNorm) and projected into the language model (Gemma 3's
text decoder, models/gemma.py) by a plain matrix.

The one thing no other family does: an image's tokens attend to each other both ways,
earlier and later ones alike (`bidirectional_images`; text stays causal, and a sliding
layer's window still bounds what a token sees from below). The engine says so to the
attention backends as each query token's last visible key (worker/image_feeder.py), and
the scheduler never ends a prefill chunk inside an image (core/request.py
`fit_chunk`), so every image token's query meets all of its image's keys.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from cadence.layers.norm import GemmaRMSNorm
from cadence.models.siglip import SiglipVisionTransformer
from cadence.models.vision_language import VisionLanguageModel
from cadence.multimodal.inputs import ImageInput


class Gemma3Projector(nn.Module):
    def __init__(self, vision, text_hidden: int, tokens: int) -> None:
        super().__init__()
        self.patches_side = vision.image_size // vision.patch_size
        self.tokens_side = int(round(tokens**0.5))
        if self.tokens_side**2 != tokens or self.patches_side % self.tokens_side:
            raise ValueError(
                f"mm_tokens_per_image {tokens} does not pool a {self.patches_side}^2 patch grid"
            )
        self.mm_input_projection_weight = nn.Parameter(torch.zeros(vision.hidden_size, text_hidden))
        self.mm_soft_emb_norm = GemmaRMSNorm(vision.hidden_size, vision.layer_norm_eps)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """[images, patches, d] -> [images, tokens, text hidden]."""
        n, _, d = x.shape
        side, kernel = self.patches_side, self.patches_side // self.tokens_side
        grid = x.transpose(1, 2).reshape(n, d, side, side)
        pooled = F.avg_pool2d(grid, kernel, kernel).flatten(2).transpose(1, 2)
        return self.mm_soft_emb_norm(pooled.contiguous()) @ self.mm_input_projection_weight


class Gemma3ForConditionalGeneration(VisionLanguageModel):
    vision_prefixes = ("vision_tower.", "multi_modal_projector.")
    bidirectional_images = True

    def build_vision(self, config) -> None:
        vision = config.vision_config
        self.image_size = vision.image_size
        self.tokens_per_image = int(getattr(config.vision_language, "mm_tokens_per_image", 256))
        self.vision_tower = SiglipVisionTransformer(vision)
        self.multi_modal_projector = Gemma3Projector(
            vision, config.hidden_size, self.tokens_per_image
        )

    def vision_name(self, name: str) -> str | None:
        name = name.replace("vision_tower.vision_model.", "vision_tower.")
        return None if name.startswith("vision_tower.head.") else name  # (a head it never reads)

    def check_image(self, image: ImageInput) -> None:
        shape, side = image.tensors["pixel_values"].shape, self.image_size
        if shape != [1, 3, side, side]:
            raise ValueError(f"pixel_values of shape {shape}: expected [1, 3, {side}, {side}]")
        if image.length != self.tokens_per_image:
            raise ValueError(f"{image.length} placeholder tokens for {self.tokens_per_image}")

    def encode(self, images: list[ImageInput]) -> list[torch.Tensor]:
        like = self.multi_modal_projector.mm_input_projection_weight
        pixels = torch.cat([self.device_tensor(image, "pixel_values", like) for image in images])
        return list(self.multi_modal_projector(self.vision_tower(pixels)).unbind(0))

    def graph_input(self, images: list[ImageInput]):
        return self.one_image_pixels(images, self.multi_modal_projector.mm_input_projection_weight)

    def graph_body(self, key):
        return lambda pixels: self.multi_modal_projector(self.vision_tower(pixels))[0]
