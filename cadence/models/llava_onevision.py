"""LLaVA-OneVision and LLaVA-NeXT ("anyres"): an image is its overview at the tower's
size plus a grid of tiles at the best of `image_grid_pinpoints`; the grid's features are
cut back to the image's own aspect (the padding's rows or columns dropped), end each row
with the learned `image_newline`, and follow the overview's.

    OneVision  a SigLIP tower read at `vision_feature_layer` (the last, before its final
               norm), every patch; the grid shrunk by bilinear interpolation to at most
               `anyres_max_N` tiles' worth; an image among several in a prompt is its
               overview alone, then one newline (the API side sends only the overview)
    NeXT       a CLIP tower read at `vision_feature_layer` (-2), the class token dropped;
               every image with its tiles

cadence/multimodal/families.py counts the tokens the same way (`onevision_tokens`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from cadence.models.clip import CLIPVisionTransformer
from cadence.models.llava import LlavaProjector
from cadence.models.siglip import SiglipVisionTransformer
from cadence.models.vision_language import VisionLanguageModel
from cadence.multimodal.families import (
    anyres_layout,
    anyres_max_tiles,
    anyres_shrink,
    onevision_tokens,
)
from cadence.multimodal.inputs import ImageInput


class LlavaOnevisionForConditionalGeneration(VisionLanguageModel):
    vision_prefixes = ("vision_tower.", "multi_modal_projector.", "image_newline")

    def build_vision(self, config) -> None:
        top, vision = config.vision_language, config.vision_config
        layer = getattr(top, "vision_feature_layer", -1)
        if not isinstance(layer, int):
            raise ValueError("an anyres LLaVA reads one feature layer")
        total = vision.num_hidden_layers
        self.feature_layer = layer if layer >= 0 else total + 1 + layer
        self.keep_class_token = getattr(top, "vision_feature_select_strategy", "full") == "full"
        self.tile = vision.image_size
        self.side = vision.image_size // vision.patch_size  # patches a tile side
        self.pinpoints = [tuple(p) for p in top.image_grid_pinpoints]
        self.build_tower(vision)
        self.multi_modal_projector = LlavaProjector(
            vision.hidden_size,
            config.hidden_size,
            getattr(top, "projector_hidden_act", "gelu"),
            bool(getattr(top, "multimodal_projector_bias", True)),
        )
        self.image_newline = nn.Parameter(torch.empty(config.hidden_size))

    def build_tower(self, vision) -> None:
        self.vision_tower = SiglipVisionTransformer(vision, self.feature_layer, final_norm=False)

    def tower(self, pixels: torch.Tensor) -> torch.Tensor:
        """[tiles, 3, S, S] -> [tiles, side * side, hidden]: the feature layer's output."""
        return self.vision_tower(pixels)

    def vision_name(self, name: str) -> str | None:
        return self.tower_weight_name(name, self.feature_layer)

    def check_image(self, image: ImageInput) -> None:
        shape = image.tensors["pixel_values"].shape
        if len(shape) != 4 or shape[1:] != [3, self.tile, self.tile] or shape[0] < 1:
            raise ValueError(f"pixel_values of shape {shape}: expected [tiles, 3, S, S]")
        if shape[0] > 1:
            size = image.tensors["image_sizes"]
            if size.shape != [1, 2] or size.dtype != "int64":
                raise ValueError("tiles need image_sizes [1, 2]")
            height, width = (int(v) for v in size.to_torch()[0])
            if min(height, width) < 1:
                raise ValueError(f"an image of {height}x{width}")
            rows, cols, _ = anyres_layout(height, width, self.tile, self.side, self.pinpoints)
            if shape[0] != 1 + rows * cols:
                raise ValueError(f"{shape[0]} tiles for an image of {height}x{width}")
        if image.length != (expected := self.tokens(image)):
            raise ValueError(f"{image.length} placeholder tokens for {expected}")

    def encode(self, images: list[ImageInput]) -> list[torch.Tensor]:
        like = self.multi_modal_projector.linear_1.weight
        tiles = [self.device_tensor(image, "pixel_values", like) for image in images]
        features = self.multi_modal_projector(self.tower(torch.cat(tiles)))
        out, start = [], 0
        for image, pixels in zip(images, tiles):
            image_features = features[start : start + pixels.shape[0]]
            start += pixels.shape[0]
            out.append(self._pack(image, image_features))
        return out

    # ---- anyres ------------------------------------------------------------------------

    def tokens(self, image: ImageInput) -> int:
        pixels = {"pixel_values": image.tensors["pixel_values"].to_torch().numpy()}
        if "image_sizes" in image.tensors:
            pixels["image_sizes"] = image.tensors["image_sizes"].to_torch().numpy()
        return onevision_tokens(pixels, self.config.vision_language)

    def _pack(self, image: ImageInput, features: torch.Tensor) -> torch.Tensor:
        newline = self.image_newline.to(features.dtype)
        if features.shape[0] == 1:
            return torch.cat([features[0], newline[None]])
        height, width = (int(v) for v in image.tensors["image_sizes"].to_torch()[0])
        s, d = self.side, features.shape[-1]
        rows, cols, (top, bottom, left, right) = anyres_layout(
            height, width, self.tile, s, self.pinpoints
        )
        grid = features[1:].view(rows, cols, s, s, d).permute(4, 0, 2, 1, 3)
        grid = grid.reshape(d, rows * s, cols * s)[:, top:bottom, left:right]
        max_tiles = anyres_max_tiles(self.config.vision_language)
        shrunk = max_tiles and anyres_shrink(bottom - top, right - left, s, max_tiles)
        if shrunk:
            grid = F.interpolate(grid[None], list(shrunk), mode="bilinear")[0]
        grid = torch.cat([grid, newline[:, None, None].expand(d, grid.shape[1], 1)], dim=-1)
        return torch.cat([features[0], grid.flatten(1).transpose(0, 1)])


class LlavaNextForConditionalGeneration(LlavaOnevisionForConditionalGeneration):
    def build_tower(self, vision) -> None:
        self.vision_tower = CLIPVisionTransformer(vision, self.feature_layer)

    def tower(self, pixels: torch.Tensor) -> torch.Tensor:
        (features,) = self.vision_tower.hidden_states(pixels, [self.feature_layer])
        return features if self.keep_class_token else features[:, 1:]
