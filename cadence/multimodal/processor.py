"""Prompt text and images -> token ids and ImageInputs: the model's own Hugging Face image
processor (its resizing and normalisation are the model's truth), its tokenizer, and the
family's placeholder expansion (cadence/multimodal/families.py).

    prompts = ImagePrompts.for_model(path)          # None for a text-only model
    ids, images = prompts.process("USER: <image> what is this?", [pil_image])

The text names each image once by the family's placeholder (`prompts.placeholder`), as
the model's chat template writes it; each is expanded to the image's placeholder tokens.
The model's full processor class is not used: some load only with torchvision (for
videos), which images do not need. CPU work: the API server runs it off the event loop.
"""

from __future__ import annotations

import json
import os
import threading

import numpy as np

from cadence.multimodal.families import FAMILIES, Family, image_token_id, substitute
from cadence.multimodal.inputs import ImageInput, TensorData, hash_tensors
from cadence.multimodal.media import MediaError


class ImagePrompts:
    def __init__(
        self, model_path: str, family: Family, token_id: int, pixel_dtype: str = "float32"
    ) -> None:
        """`pixel_dtype`: what the images' float tensors are sent as (the engine's model
        dtype: the encoder would cast them to it)."""
        from transformers import AutoConfig, AutoImageProcessor

        from cadence.tokenizer import load_tokenizer

        self.family = family
        self.image_token_id = token_id
        self.pixel_dtype = pixel_dtype
        self.placeholder = family.placeholder
        try:
            self.config = AutoConfig.from_pretrained(model_path)
            self.images = AutoImageProcessor.from_pretrained(model_path)
        except (OSError, ValueError) as e:
            raise ValueError(f"cannot load the image processor in {model_path!r}: {e}") from e
        # A tokenizer of its own: one is not safe to share between threads (one call at a
        # time here, under the lock).
        self.tokenizer = load_tokenizer(model_path)
        if self.tokenizer.convert_tokens_to_ids(family.span_token) != token_id:
            raise ValueError(
                f"the tokenizer does not map the image token {family.span_token!r} to the "
                f"config's image token id {token_id}"
            )
        self._lock = threading.Lock()

    @classmethod
    def for_model(cls, model_path: str | None, pixel_dtype: str = "float32") -> ImagePrompts | None:
        """The processor of a vision-language model's folder; None for any other model."""
        if model_path is None:
            return None
        try:
            with open(os.path.join(model_path, "config.json")) as f:
                config = json.load(f)
        except (OSError, ValueError):
            return None
        token_id = image_token_id(config)
        if token_id is None:
            return None
        return cls(model_path, FAMILIES[config["model_type"]], token_id, pixel_dtype)

    def process(
        self, text: str, images: list, add_special_tokens: bool = False
    ) -> tuple[list[int], list[ImageInput]]:
        """Token ids of `text` with each placeholder expanded, and one ImageInput per image
        (in the text's order). MediaError if placeholders and images do not pair up."""
        found = text.count(self.placeholder)
        if found != len(images):
            raise MediaError(
                f"the prompt names {found} images ({self.placeholder!r}) but {len(images)} "
                "were sent"
            )
        per_image: list[dict] = []
        if images:
            extra = self.family.processor_kwargs or {}
            batch = [[image] for image in images] if self.family.nested else images
            try:
                pixels = self.images(batch, return_tensors="np", **extra)
                arrays = {k: np.asarray(v) for k, v in pixels.items()}
                per_image = self.family.split(arrays, len(images))
            except (ValueError, TypeError) as e:  # (an aspect ratio it refuses, say)
                raise MediaError(f"the model's image processor refused the image: {e}") from None
        texts, encoded = [], []  # what replaces each placeholder; what the engine encodes
        for tensors in per_image:
            text_of, parts = self.family.expand(tensors, self.config, len(images))
            texts.append(text_of)
            encoded += parts
        counts = [self.family.tokens(tensors, self.config) for tensors in encoded]
        with self._lock:
            ids = self.tokenizer.encode(
                substitute(text, self.placeholder, texts), add_special_tokens=add_special_tokens
            )
        positions = [i for i, t in enumerate(ids) if t == self.image_token_id]
        if len(positions) != sum(counts):
            raise MediaError("the text around the placeholders merged into image tokens")
        inputs, taken = [], 0
        for tensors, count in zip(encoded, counts):
            wire = {
                name: TensorData.of_numpy(value, self.pixel_dtype)
                for name, value in tensors.items()
            }
            inputs.append(ImageInput(hash_tensors(wire), positions[taken], count, wire))
            taken += count
        return ids, inputs
