"""A vision-language model: a language model of one of our families, with an image
encoder beside it whose output replaces the image placeholder tokens' embeddings.

A family file subclasses `VisionLanguageModel` and says how it encodes (`build_vision`,
`encode`) and how its checkpoint names its language model; `compose` makes the served
class: the family's class first, then the language model's decoder class (the config's
`model_type` chooses it, or the family's `language_model` names one), so every other part
of the engine sees the decoder it knows (layers, rotary tables, logits), with these extras:

    image_token_id             the placeholder token (the config's)
    check_images(images)       ValueError for images this encoder cannot take (at admission)
    encode_images(images)      one [placeholder tokens, hidden] tensor per image, batched
    graph_input / graph_body   one image's encoding in a CUDA graph, where the family has
                               it (worker/encoder_graphs.py); else eager
    mrope_positions(n, images) a family whose rotary positions are three-dimensional
                               (M-RoPE, `uses_mrope`): ([3, n] positions of an n-token
                               prompt, the offset of every later token's position from its
                               index)
    bidirectional_images       an image's tokens attend to each other both ways (Gemma 3):
                               the engine prefills each image whole and hands the attention
                               backend each token's last visible key

The config it is built from is the language model's (loader/hf_config.py `language_view`),
with the vision config and the whole config beside it (`vision_config`, `vision_language`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Hashable
from typing import NamedTuple

import torch
from torch import nn

from cadence.multimodal.inputs import ImageInput


class ImageRows(NamedTuple):
    """What a step's forward pass takes from the vision encoder."""

    rows: torch.Tensor  # [N] rows of the step's tokens whose embeddings are replaced ...
    embeds: torch.Tensor  # [N, hidden] ... by these
    positions: torch.Tensor | None = None  # [3, T] the step's M-RoPE positions (else None)


class VisionLanguageModel(nn.Module):
    # Checkpoint name prefixes of the vision side (kept as they are); the rest is the
    # language model's, under `language_model_prefixes` (stripped before its own mapping).
    vision_prefixes: tuple[str, ...] = ()
    language_model_prefixes: tuple[str, ...] = ("language_model.model.", "language_model.")
    language_model: str | None = None  # an architecture name; None: by the config's model_type

    def __init__(self, config, backend, max_position: int) -> None:
        super().__init__(config, backend, max_position)
        if self.bidirectional_images and not backend.capabilities.key_limits:
            raise ValueError(
                f"{type(self).__name__} attends an image's tokens both ways; the {backend.name} "
                "attention backend cannot"
            )
        self.image_token_id = int(config.image_token_id)
        self.build_vision(config)

    # ---- the family's hooks --------------------------------------------------------------

    def build_vision(self, config) -> None:
        raise NotImplementedError

    def check_image(self, image: ImageInput) -> None:
        """ValueError unless the image's tensors are what `encode` takes."""
        raise NotImplementedError

    def encode(self, images: list[ImageInput]) -> list[torch.Tensor]:
        raise NotImplementedError

    def vision_name(self, name: str) -> str | None:
        """Our name for a vision-side checkpoint tensor (None: skip it)."""
        return name

    def tower_weight_name(self, name: str, layers_built: int) -> str | None:
        """A `vision_tower.` checkpoint name as ours: `vision_model.` dropped (the layout
        of older checkpoints), None for what a tower read at an inner layer never uses
        (its final norm, a pooling head, the layers after the one read)."""
        name = name.replace("vision_tower.vision_model.", "vision_tower.")
        if name.startswith(("vision_tower.post_layernorm.", "vision_tower.head.")):
            return None
        parts = name.split(".")
        if parts[1:3] == ["encoder", "layers"] and int(parts[3]) >= layers_built:
            return None
        return name

    def mrope_positions(self, prompt_len: int, images: list[ImageInput]):
        raise NotImplementedError  # (a family with uses_mrope)

    # ---- the encoder in CUDA graphs (worker/encoder_graphs.py) ---------------------------

    def graph_input(self, images: list[ImageInput]) -> tuple[Hashable, torch.Tensor] | None:
        """For one image whose encoding `graph_body` replays: (the key of all but its pixels
        that the encoding depends on, its pixels on the device); None (the default): eager."""
        return None

    def graph_body(self, key: Hashable) -> Callable[[torch.Tensor], torch.Tensor]:
        """fn(pixels) -> [placeholder tokens, hidden] of one image of `key`, reading no host
        data (capturable); called once per key."""
        raise NotImplementedError  # (a family whose graph_input gives keys)

    # ---- shared --------------------------------------------------------------------------

    def check_images(self, images: list[ImageInput]) -> None:
        for i, image in enumerate(images):
            try:
                self.check_image(image)
            except (KeyError, ValueError, IndexError) as e:
                raise ValueError(f"image {i} does not fit this model's encoder: {e}") from None

    @torch.inference_mode()
    def encode_images(self, images: list[ImageInput]) -> list[torch.Tensor]:
        features = self.encode(images)
        for image, rows in zip(images, features, strict=True):
            if rows.shape[0] != image.length:
                raise ValueError(
                    f"the encoder made {rows.shape[0]} rows for an image of {image.length} "
                    "placeholder tokens"
                )
        return features

    def checkpoint_name(self, name: str) -> str | None:
        if name.startswith(self.vision_prefixes):
            return self.vision_name(name)
        for prefix in self.language_model_prefixes:
            if name.startswith(prefix):
                name = name.removeprefix(prefix)
                break
        return super().checkpoint_name(name)

    def one_image_pixels(self, images: list[ImageInput], like: torch.Tensor):
        """graph_input of a family whose every image is one pixel tensor of the tower's
        size (checked at admission): one key for all; None for several images."""
        if len(images) != 1:
            return None
        return "image", self.device_tensor(images[0], "pixel_values", like)

    @staticmethod
    def device_tensor(image: ImageInput, name: str, like: torch.Tensor) -> torch.Tensor:
        """One of the image's tensors, on `like`'s device (floats in its dtype)."""
        t = image.tensors[name].to_torch()
        return t.to(like.device, like.dtype if t.is_floating_point() else t.dtype)


@functools.cache
def compose(family: type[VisionLanguageModel], decoder: type[nn.Module]) -> type[nn.Module]:
    """The served class: the family's vision parts over `decoder`'s language model."""
    return type(family.__name__, (family, decoder), {"__module__": family.__module__})
