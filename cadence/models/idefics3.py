"""Idefics3 and SmolVLM: a SigLIP vision tower (models/siglip.py) over square tiles of an
image, and a connector that folds each tile's scale x scale neighbouring patches into one
token (pixel shuffle) and projects them into the language model (Llama: SmolLM2 under
SmolVLM).

An image reaches the engine as its tiles, each an image of its own (the API side writes
the tiles' placeholders apart, between row / column tags: cadence/multimodal/families.py):
every tile is the tower's size, fully covered (the image processor resizes to whole
tiles and the overview to one), so patch positions are plain and no patch is masked.
"""

from __future__ import annotations

import torch
from torch import nn

from cadence.models.siglip import SiglipVisionTransformer
from cadence.models.vision_language import VisionLanguageModel
from cadence.multimodal.inputs import ImageInput


class Connector(nn.Module):
    def __init__(self, vision_hidden: int, text_hidden: int, scale: int) -> None:
        super().__init__()
        self.scale = scale
        self.modality_projection = nn.Module()
        self.modality_projection.proj = nn.Linear(
            vision_hidden * scale * scale, text_hidden, bias=False
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """[tiles, side*side, d] -> [tiles, side*side / scale^2, d * scale^2]: each token the
        scale x scale patches of a block, row by row, projected."""
        n, seq, d = x.shape
        side, s = int(seq**0.5), self.scale
        x = x.view(n, side, side // s, d * s).permute(0, 2, 1, 3)
        x = x.reshape(n, side // s, side // s, d * s * s).permute(0, 2, 1, 3)
        return self.modality_projection.proj(x.reshape(n, seq // (s * s), d * s * s))


class Idefics3ForConditionalGeneration(VisionLanguageModel):
    vision_prefixes = ("vision_model.", "connector.")
    language_model_prefixes = ("text_model.",)

    def build_vision(self, config) -> None:
        vision = config.vision_config
        scale = int(getattr(config.vision_language, "scale_factor", 2))
        self.tile = vision.image_size
        self.tile_tokens = (vision.image_size // vision.patch_size) ** 2 // (scale * scale)
        self.vision_model = SiglipVisionTransformer(vision)
        self.connector = Connector(vision.hidden_size, config.hidden_size, scale)

    def check_image(self, image: ImageInput) -> None:
        shape, side = image.tensors["pixel_values"].shape, self.tile
        if shape != [1, 3, side, side]:
            raise ValueError(f"a tile of shape {shape}: expected [1, 3, {side}, {side}]")
        if image.length != self.tile_tokens:
            raise ValueError(f"{image.length} placeholder tokens for a tile of {self.tile_tokens}")

    def encode(self, images: list[ImageInput]) -> list[torch.Tensor]:
        like = self.connector.modality_projection.proj.weight
        pixels = torch.cat([self.device_tensor(image, "pixel_values", like) for image in images])
        return list(self.connector(self.vision_model(pixels)).unbind(0))

    def graph_input(self, images: list[ImageInput]):
        return self.one_image_pixels(images, self.connector.modality_projection.proj.weight)

    def graph_body(self, key):
        return lambda pixels: self.connector(self.vision_model(pixels))[0]


class SmolVLMForConditionalGeneration(Idefics3ForConditionalGeneration):
    pass
