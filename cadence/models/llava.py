"""LLaVA (1.5 and its Mistral / Qwen2 variants that keep one image size): a CLIP vision
tower read at one of its layers (`vision_feature_layer`, -2 by default; a list
concatenates several), the class token dropped (`vision_feature_select_strategy`
"default") or kept ("full"), and a two-layer MLP projector into the language model's
embeddings. Every image is resized to the tower's size: the same number of tokens each."""

from __future__ import annotations

import torch
from torch import nn

from cadence.models.clip import CLIPVisionTransformer
from cadence.models.vision_language import VisionLanguageModel
from cadence.models.vision_layers import activation
from cadence.multimodal.inputs import ImageInput


class LlavaProjector(nn.Module):
    def __init__(self, vision_width: int, text_hidden: int, act: str, bias: bool) -> None:
        super().__init__()
        self.linear_1 = nn.Linear(vision_width, text_hidden, bias=bias)
        self.act = activation(act)
        self.linear_2 = nn.Linear(text_hidden, text_hidden, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear_2(self.act(self.linear_1(x)))


class LlavaForConditionalGeneration(VisionLanguageModel):
    vision_prefixes = ("vision_tower.", "multi_modal_projector.")

    def build_vision(self, config) -> None:
        top, vision = config.vision_language, config.vision_config
        layers = getattr(top, "vision_feature_layer", -2)
        layers = list(layers) if isinstance(layers, (list, tuple)) else [layers]
        total = vision.num_hidden_layers
        # hidden state k: the output of k layers (0: the embeddings); -1: the last
        self.feature_layers = [k if k >= 0 else total + 1 + k for k in layers]
        if not all(0 <= k <= total for k in self.feature_layers):
            raise ValueError(f"vision_feature_layer {layers} outside the tower's {total} layers")
        self.keep_class_token = getattr(top, "vision_feature_select_strategy", "default") == "full"
        self.image_size = vision.image_size
        self.vision_tower = CLIPVisionTransformer(vision, max(self.feature_layers))
        self.multi_modal_projector = LlavaProjector(
            vision.hidden_size * len(self.feature_layers),
            config.hidden_size,
            getattr(top, "projector_hidden_act", "gelu"),
            bool(getattr(top, "multimodal_projector_bias", True)),
        )

    def vision_name(self, name: str) -> str | None:
        return self.tower_weight_name(name, len(self.vision_tower.encoder.layers))

    def check_image(self, image: ImageInput) -> None:
        shape = image.tensors["pixel_values"].shape
        side = self.image_size
        if shape != [1, 3, side, side]:
            raise ValueError(f"pixel_values of shape {shape}: expected [1, 3, {side}, {side}]")
        patches = (side // self.vision_tower.embeddings.patch_embedding.stride[0]) ** 2
        if image.length != patches + int(self.keep_class_token):
            raise ValueError(f"{image.length} placeholder tokens for {patches} patches")

    def encode(self, images: list[ImageInput]) -> list[torch.Tensor]:
        like = self.multi_modal_projector.linear_1.weight
        pixels = torch.cat([self.device_tensor(image, "pixel_values", like) for image in images])
        return list(self.encode_pixels(pixels).unbind(0))

    def encode_pixels(self, pixels: torch.Tensor) -> torch.Tensor:
        """[images, 3, S, S] -> [images, tokens, hidden]."""
        states = self.vision_tower.hidden_states(pixels, self.feature_layers)
        features = torch.cat(states, dim=-1)
        if not self.keep_class_token:
            features = features[:, 1:]
        return self.multi_modal_projector(features)

    def graph_input(self, images: list[ImageInput]):
        return self.one_image_pixels(images, self.multi_modal_projector.linear_1.weight)

    def graph_body(self, key):
        return lambda pixels: self.encode_pixels(pixels)[0]
