"""What the API process must know of each vision-language family (no torch): its
placeholder, how its image processor's batched outputs split into one set of tensors per
image, and how many placeholder tokens each image takes.

    llava       pixel_values [images, 3, H, W]: one row each; every image is resized to
                the tower's size: (size / patch)^2 tokens (+1 with the class token kept)
    qwen2_vl    pixel_values [patches of all images, C*T*P*P] with image_grid_thw
    qwen2_5_vl  [images, 3]: image i's rows are its t*h*w patches; merge^2 patches make
                one token

    idefics3    pixel_values [images, tiles, 3, S, S] with rows / cols: an image is its
    smolvlm     rows x cols tiles and itself at tile size, each an image to the engine,
                written between row / column tags (`render`)
    gemma3      pixel_values [images, 3, S, S]: one row each, mm_tokens_per_image tokens
                (the patch grid pooled), between begin- and end-image tags
    llava_onevision  pixel_values [images, tiles, 3, S, S] with image_sizes: an image
    llava_next  is its overview and its pinpoint's tiles (`anyres_layout`); OneVision's
                among several its overview only; tokens as their processors count them

The prompt names each image by the placeholder once (as the model's chat template writes
it); `Family.expand` gives what replaces it (the placeholder, or the family's image token,
repeated to the image's token count, as the model's own processor does) and the images the
engine encodes.
A family the engine runs (cadence/models/architectures.py) and this table must agree:
tests/multimodal/test_families.py checks every vision-language architecture is here.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

Tensors = dict[str, np.ndarray]


@dataclass(frozen=True)
class Family:
    placeholder: str  # the token text a prompt names an image by
    # the image processor's outputs (pixel tensors) -> one dict per image
    split: Callable[[Tensors, int], list[Tensors]]
    # placeholder tokens of an image (or tile), from its tensors and the model's config
    tokens: Callable[[Tensors, object], int]
    # an image, the prompt's image count -> (the text that replaces its placeholder, the
    # images the engine encodes: the image itself, or its tiles); None: the placeholder
    # repeated per token, and the image itself
    render: Callable[[Tensors, object, Family, int], tuple[str, list[Tensors]]] | None = None
    processor_kwargs: dict | None = None  # what the image processor is called with besides
    nested: bool = False  # the image processor takes [[image], [image], ...] (a sample each)
    image_token: str | None = None  # the token an image's span repeats (None: the placeholder)

    @property
    def span_token(self) -> str:
        return self.image_token or self.placeholder

    def expand(self, tensors: Tensors, config, prompt_images: int) -> tuple[str, list[Tensors]]:
        if self.render is not None:
            return self.render(tensors, config, self, prompt_images)
        return self.placeholder * self.tokens(tensors, config), [tensors]


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


def _tiles_split(outputs: Tensors, count: int) -> list[Tensors]:
    pixels, rows, cols = outputs["pixel_values"], outputs["rows"], outputs["cols"]
    if pixels.shape[0] != count:
        raise ValueError(f"the image processor made {pixels.shape[0]} images of {count}")
    out = []
    for i in range(count):
        r, c = int(np.ravel(rows[i])[0]), int(np.ravel(cols[i])[0])
        tiles = r * c + 1 if r else 1  # the tiles, then the whole image at tile size
        out.append(
            {"pixel_values": pixels[i, :tiles], "rows": np.array([r]), "cols": np.array([c])}
        )
    return out


def _tile_tokens(tensors: Tensors, config) -> int:
    vision, scale = config.vision_config, config.scale_factor
    return (vision.image_size // vision.patch_size) ** 2 // (scale * scale)


def _render_tiles(
    tensors: Tensors, config, family: Family, prompt_images: int
) -> tuple[str, list[Tensors]]:
    """Idefics3's layout: each tile's tokens after a row / column tag, a line a row, then
    the whole image's after <global-img>, each run between <fake_token_around_image>."""
    pixels = tensors["pixel_values"]
    rows, cols = int(tensors["rows"][0]), int(tensors["cols"][0])
    tiles = [{"pixel_values": pixels[j : j + 1]} for j in range(pixels.shape[0])]
    run = family.placeholder * _tile_tokens(tiles[0], config)
    fake, overview = "<fake_token_around_image>", "<global-img>"
    if not rows:
        return f"{fake}{overview}{run}{fake}", tiles
    grid = "".join(
        "".join(f"{fake}<row_{r + 1}_col_{c + 1}>{run}" for c in range(cols)) + "\n"
        for r in range(rows)
    )
    return f"{grid}\n{fake}{overview}{run}{fake}", tiles


def anyres_layout(
    height: int, width: int, tile: int, side: int, pinpoints: list
) -> tuple[int, int, tuple[int, int, int, int]]:
    """LLaVA-OneVision's tiles for an image of height x width: (rows, columns) of the
    pinpoint that fits it best (the most of its pixels kept, then the least padding, as the
    image processor picks it), and (top, bottom, left, right): the patch rows and columns
    of the grid (`side` patches a tile) that hold the image rather than padding."""
    from transformers.image_processing_utils import select_best_resolution

    best_h, best_w = select_best_resolution((height, width), [tuple(p) for p in pinpoints])
    rows, cols = best_h // tile, best_w // tile
    h, w = rows * side, cols * side
    if width / height > w / h:
        pad = (h - int(round(height * (w / width), 7))) // 2
        return rows, cols, (pad, h - pad, 0, w)
    pad = (w - int(round(width * (h / height), 7))) // 2
    return rows, cols, (0, h, pad, w - pad)


def anyres_shrink(h: int, w: int, side: int, max_tiles: int) -> tuple[int, int] | None:
    """The size a kept h x w patch grid is interpolated to (None: kept as it is): at most
    about `max_tiles` tiles of patches ("anyres_max_9")."""
    ratio = math.sqrt(h * w / (max_tiles * side * side))
    return (int(h // ratio), int(w // ratio)) if ratio > 1.1 else None


def anyres_max_tiles(config) -> int | None:
    """OneVision's "anyres_max_N": N; None where the grid is never shrunk (LLaVA-NeXT)."""
    ratio = getattr(config, "vision_aspect_ratio", None)
    return int(str(ratio).removeprefix("anyres_max_")) if ratio else None


def onevision_tokens(tensors: Tensors, config) -> int:
    """Placeholder tokens of a LLaVA-OneVision image (its overview, or with image_sizes,
    its tiles too): what the model's processor counts."""
    vision = config.vision_config
    side = vision.image_size // vision.patch_size
    if tensors["pixel_values"].shape[0] == 1:  # the overview alone, then a newline
        return side * side + 1
    height, width = (int(v) for v in tensors["image_sizes"][0])
    _, _, (top, bottom, left, right) = anyres_layout(
        height, width, vision.image_size, side, config.image_grid_pinpoints
    )
    h, w = bottom - top, right - left
    max_tiles = anyres_max_tiles(config)
    h, w = (max_tiles and anyres_shrink(h, w, side, max_tiles)) or (h, w)
    return side * side + h * w + h  # the overview, the kept grid, a newline a row


def _onevision_split(outputs: Tensors, count: int) -> list[Tensors]:
    pixels, sizes = outputs["pixel_values"], outputs["image_sizes"]
    if pixels.shape[0] != count:
        raise ValueError(f"the image processor made {pixels.shape[0]} images of {count}")
    return [{"pixel_values": pixels[i], "image_sizes": sizes[i : i + 1]} for i in range(count)]


def _render_onevision(
    tensors: Tensors, config, family: Family, prompt_images: int
) -> tuple[str, list[Tensors]]:
    """An image alone: its overview and the tiles of its best pinpoint; among several: its
    overview only (as the model reads a multi-image prompt)."""
    pixels, sizes = tensors["pixel_values"], tensors["image_sizes"]
    if prompt_images > 1 and anyres_max_tiles(config):  # (OneVision's; NeXT tiles every one)
        image = {"pixel_values": pixels[:1]}
    else:
        vision = config.vision_config
        height, width = (int(v) for v in sizes[0])
        rows, cols, _ = anyres_layout(
            height, width, vision.image_size, 1, config.image_grid_pinpoints
        )
        image = {"pixel_values": pixels[: 1 + rows * cols], "image_sizes": sizes}
    return family.placeholder * onevision_tokens(image, config), [image]


def _gemma3_tokens(tensors: Tensors, config) -> int:
    return int(getattr(config, "mm_tokens_per_image", 256))


def _render_gemma3(
    tensors: Tensors, config, family: Family, prompt_images: int
) -> tuple[str, list[Tensors]]:
    """Gemma 3's: the soft tokens between the begin-image tag (the placeholder, kept) and
    the end-image tag, a blank line on either side."""
    run = family.span_token * _gemma3_tokens(tensors, config)
    return f"\n\n{family.placeholder}{run}<end_of_image>\n\n", [tensors]


_ANYRES = Family("<image>", _onevision_split, onevision_tokens, _render_onevision, None, True)
_IDEFICS3 = Family(
    "<image>", _tiles_split, _tile_tokens, _render_tiles, {"return_row_col_info": True}, True
)
FAMILIES: dict[str, Family] = {
    "llava": Family("<image>", _rows, _tower_tokens),
    "qwen2_vl": Family("<|image_pad|>", _grid_split, _grid_tokens),
    "qwen2_5_vl": Family("<|image_pad|>", _grid_split, _grid_tokens),
    "idefics3": _IDEFICS3,
    "smolvlm": _IDEFICS3,
    "llava_onevision": _ANYRES,
    "llava_next": _ANYRES,
    # Pan-and-scan crops (an option of Gemma 3's processor, off by default) are not taken.
    "gemma3": Family(
        "<start_of_image>",
        _rows,
        _gemma3_tokens,
        _render_gemma3,
        {"do_pan_and_scan": False},
        image_token="<image_soft_token>",
    ),
}


def image_token_id(config: dict) -> int | None:
    """The placeholder token of a vision-language config.json (None: a text model)."""
    if config.get("model_type") not in FAMILIES:
        return None
    for key in ("image_token_id", "image_token_index"):
        if config.get(key) is not None:
            return int(config[key])
    return None


def substitute(text: str, placeholder: str, replacements: list[str]) -> str:
    """`text` with its k-th placeholder replaced by replacements[k]."""
    pieces = text.split(placeholder)
    if len(pieces) != len(replacements) + 1:
        raise ValueError(f"{len(pieces) - 1} placeholders for {len(replacements)} images")
    out = [pieces[0]]
    for replacement, piece in zip(replacements, pieces[1:]):
        out.append(replacement)
        out.append(piece)
    return "".join(out)
