"""What the API process must know of each vision-language family (plain data, no torch):
the config field naming its image token, and how its processor's batched outputs split
into one set of tensors per image.

    llava       pixel_values [images, 3, H, W]: one row each; every image the same
                number of placeholder tokens
    qwen2_vl    pixel_values [patches of all images, C*T*P*P] with image_grid_thw
                [images, 3]: image i's rows are its t*h*w patches; merge_size^2 patches
                become one token

A family the engine runs (cadence/models/architectures.py) and this table must agree:
tests/multimodal/test_families.py checks every vision-language architecture is here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

Tensors = dict[str, np.ndarray]


@dataclass(frozen=True)
class Family:
    # splits the processor's outputs (pixel tensors only) into one dict per image
    split: Callable[[Tensors, int], list[Tensors]]
    # placeholder tokens of an image, given its tensors, the model's config and the
    # prompt's image tokens divided evenly among its images
    tokens: Callable[[Tensors, dict, int], int]


def _rows(outputs: Tensors, count: int) -> list[Tensors]:
    pixels = outputs["pixel_values"]
    if pixels.shape[0] != count:
        raise ValueError(f"the processor made {pixels.shape[0]} images of {count}")
    return [{"pixel_values": pixels[i : i + 1]} for i in range(count)]


def _even_share(tensors: Tensors, config: dict, share: int) -> int:
    return share  # every image is resized to one size: the same number of tokens


def _grid_split(outputs: Tensors, count: int) -> list[Tensors]:
    grids, pixels = outputs["image_grid_thw"], outputs["pixel_values"]
    if grids.shape[0] != count:
        raise ValueError(f"the processor made {grids.shape[0]} images of {count}")
    sizes = np.prod(grids, axis=1)
    if int(sizes.sum()) != pixels.shape[0]:
        raise ValueError("the processor's patches do not add up to its grids")
    starts = np.concatenate([[0], np.cumsum(sizes)])
    return [
        {"pixel_values": pixels[starts[i] : starts[i + 1]], "image_grid_thw": grids[i : i + 1]}
        for i in range(count)
    ]


def _grid_tokens(tensors: Tensors, config: dict, share: int) -> int:
    merge = config["vision_config"].get("spatial_merge_size", 2)
    return int(np.prod(tensors["image_grid_thw"][0])) // (merge * merge)


FAMILIES: dict[str, Family] = {
    "llava": Family(_rows, _even_share),
    "qwen2_vl": Family(_grid_split, _grid_tokens),
    "qwen2_5_vl": Family(_grid_split, _grid_tokens),
}


def image_token_id(config: dict) -> int | None:
    """The placeholder token of a vision-language config.json (None: a text model)."""
    if config.get("model_type") not in FAMILIES:
        return None
    for key in ("image_token_id", "image_token_index"):
        if config.get(key) is not None:
            return int(config[key])
    return None
