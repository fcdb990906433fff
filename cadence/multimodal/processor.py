"""Prompt text and images -> token ids and ImageInputs, by the model's own Hugging Face
processor (its resizing, normalisation and placeholder expansion are the model's truth).

    prompts = ImagePrompts.for_model(path)          # None for a text-only model
    ids, images = prompts.process("USER: <image> what is this?", [pil_image])

The text names each image by the processor's placeholder (`prompts.placeholder`, e.g.
"<image>"), as the model's chat template writes it; the processor expands each into the
image's placeholder tokens. CPU work: the API server calls it off the event loop.
"""

from __future__ import annotations

import json
import os
import threading

import numpy as np

from cadence.multimodal.families import FAMILIES, Family, image_token_id
from cadence.multimodal.inputs import ImageInput, TensorData, hash_tensors
from cadence.multimodal.media import MediaError


class ImagePrompts:
    def __init__(self, model_path: str, config: dict, family: Family, token_id: int) -> None:
        from transformers import AutoProcessor

        self.config = config
        self.family = family
        self.image_token_id = token_id
        try:
            self.hf = AutoProcessor.from_pretrained(model_path)
        except (OSError, ValueError) as e:
            raise ValueError(f"cannot load the image processor in {model_path!r}: {e}") from e
        self.placeholder: str = self.hf.image_token
        # One call at a time: a tokenizer is not safe to share between threads.
        self._lock = threading.Lock()

    @classmethod
    def for_model(cls, model_path: str | None) -> ImagePrompts | None:
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
        return cls(model_path, config, FAMILIES[config["model_type"]], token_id)

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
        with self._lock:
            out = self.hf(
                text=[text],
                images=images or None,
                return_tensors="np",
                add_special_tokens=add_special_tokens,
            )
        ids = [int(t) for t in out["input_ids"][0]]
        if not images:
            return ids, []
        pixels = {
            k: np.asarray(v) for k, v in out.items() if k not in ("input_ids", "attention_mask")
        }
        per_image = self.family.split(pixels, len(images))
        positions = [i for i, t in enumerate(ids) if t == self.image_token_id]
        share = len(positions) // len(images)
        inputs, taken = [], 0
        for tensors in per_image:
            length = self.family.tokens(tensors, self.config, share)
            if taken + length > len(positions):
                raise MediaError("the processor placed fewer image tokens than the images need")
            wire = {name: TensorData.of_numpy(value) for name, value in tensors.items()}
            inputs.append(ImageInput(hash_tensors(wire), positions[taken], length, wire))
            taken += length
        if taken != len(positions):
            raise MediaError("the processor placed more image tokens than the images need")
        return ids, inputs
