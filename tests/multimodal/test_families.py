"""The API side and the engine agree on the vision-language families: every architecture
the engine composes over a language model has a family entry here (its placeholder, how
its images split, their token counts), and each placeholder is replaced in place."""

from __future__ import annotations

import importlib

import pytest

from cadence.models.architectures import ARCHITECTURES, BY_MODEL_TYPE
from cadence.models.vision_language import VisionLanguageModel
from cadence.multimodal.families import FAMILIES, image_token_id, substitute


def test_every_vision_language_architecture_has_a_family():
    vision = set()
    for arch, (module, name) in ARCHITECTURES.items():
        cls = getattr(importlib.import_module(f"cadence.models.{module}"), name)
        if issubclass(cls, VisionLanguageModel):
            vision.add(arch)
    by_type = {arch: t for t, arch in BY_MODEL_TYPE.items()}
    assert vision and all(by_type.get(arch) in FAMILIES for arch in vision)
    assert {BY_MODEL_TYPE[t] for t in FAMILIES} == vision


def test_substitute_replaces_each_placeholder_in_place():
    assert substitute("a<i>b<i>", "<i>", ["<i><i>", "x"]) == "a<i><i>bx"
    with pytest.raises(ValueError):
        substitute("a<i>", "<i>", ["1", "2"])


def test_the_image_token_is_read_from_either_name():
    assert image_token_id({"model_type": "llava", "image_token_index": 7}) == 7
    assert image_token_id({"model_type": "qwen2_vl", "image_token_id": 9}) == 9
    assert image_token_id({"model_type": "llama", "image_token_id": 9}) is None
