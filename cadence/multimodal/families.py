"""What the API process must know of each vision-language family (no torch): its
placeholder, how its image processor's batched outputs split into one set of tensors per
image, and how many placeholder tokens each image takes.

    llava       pixel_values [images, 3, H, W]: one row each; every image is resized to
                the tower's size: (size / patch)^2 tokens (+1 with the class token kept)
    qwen2_vl    pixel_values [patches of all images, C*T*P*P] with image_grid_thw
    qwen2_5_vl  [images, 3]: image i's rows are its t*h*w patches; merge^2 patches make
                one token

The prompt names each image by the placeholder once (as the model's chat template writes
it); `expand` repeats it to the image's token count, as the model's own processor does.
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
    placeholder: str  # the token text a prompt names an image by
    # the image processor's outputs (pixel tensors) -> one dict per image
    split: Callable[[Tensors, int], list[Tensors]]
    # placeholder tokens of an image, from its tensors and the model's config
    tokens: Callable[[Tensors, object], int]


def _rows(outputs: Tensors, count: int) -> list[Tensors]:
    pixels = outputs["pixel_values"]
    if pixels.shape[0] != count:
        raise ValueError(f"the image processor made {pixels.shape[0]} images of {count}")
    return [{"pixel_values": pixels[i : i + 1]} for i in range(count)]


def _tower_tokens(tensors: Tensors, config) -> int:
    side = tensors["pixel_values"].shape[-1] // config.vision_config.patch_size
    full = getattr(config, "vision_feature_select_strategy", "default") == "full"
    return side * side + int(full)


def _grid_split(outputs: Tensors, count: int) -> list[Tensors]:
    grids, pixels = outputs["image_grid_thw"], outputs["pixel_values"]
    if grids.shape[0] != count:
        raise ValueError(f"the image processor made {grids.shape[0]} images of {count}")
    sizes = np.prod(grids, axis=1)
    if int(sizes.sum()) != pixels.shape[0]:
        raise ValueError("the image processor's patches do not add up to its grids")
    starts = np.concatenate([[0], np.cumsum(sizes)])
    return [
        {"pixel_values": pixels[starts[i] : starts[i + 1]], "image_grid_thw": grids[i : i + 1]}
        for i in range(count)
    ]


def _grid_tokens(tensors: Tensors, config) -> int:
    merge = config.vision_config.spatial_merge_size
    return int(np.prod(tensors["image_grid_thw"][0])) // (merge * merge)


FAMILIES: dict[str, Family] = {
    "llava": Family("<image>", _rows, _tower_tokens),
    "qwen2_vl": Family("<|image_pad|>", _grid_split, _grid_tokens),
    "qwen2_5_vl": Family("<|image_pad|>", _grid_split, _grid_tokens),
}


def image_token_id(config: dict) -> int | None:
    """The placeholder token of a vision-language config.json (None: a text model)."""
    if config.get("model_type") not in FAMILIES:
        return None
    for key in ("image_token_id", "image_token_index"):
        if config.get(key) is not None:
            return int(config[key])
    return None


def expand(text: str, placeholder: str, counts: list[int]) -> str:
    """`text` with its k-th placeholder repeated counts[k] times."""
    pieces = text.split(placeholder)
    if len(pieces) != len(counts) + 1:
        raise ValueError(f"{len(pieces) - 1} placeholders for {len(counts)} images")
    out = [pieces[0]]
    for count, piece in zip(counts, pieces[1:]):
        out.append(placeholder * count)
        out.append(piece)
    return "".join(out)
