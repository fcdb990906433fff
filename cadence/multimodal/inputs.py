"""One image of a request, as it travels from the API process to the engine (msgspec).

An image occupies `length` consecutive placeholder tokens of the prompt from `offset`; the
vision encoder turns its tensors into exactly `length` embedding rows, which replace those
tokens' embeddings. `content_hash` names the image's pixels as the processor produced
them: the worker's encoder cache and the prefix cache key by it, so the same image is
encoded once and its K/V is found again, while another image behind the same placeholder
tokens never matches.
"""

from __future__ import annotations

import hashlib
import math
import re

import msgspec

_HEX64 = re.compile(r"[0-9a-f]{64}")
# What an image's tensors may be: the processors' pixel values and grid sizes.
DTYPES: dict[str, int] = {"float32": 4, "float16": 2, "bfloat16": 2, "int64": 8}


class TensorData(msgspec.Struct, array_like=True):
    """A dense tensor as bytes, row-major (never a pickle)."""

    dtype: str  # one of DTYPES
    shape: list[int]
    data: bytes

    def check(self, what: str) -> None:
        """ValueError unless the bytes are exactly a tensor of this dtype and shape."""
        if self.dtype not in DTYPES:
            raise ValueError(f"{what}: dtype {self.dtype!r} is not one of {sorted(DTYPES)}")
        if any(d < 0 for d in self.shape) or len(self.shape) > 6:
            raise ValueError(f"{what}: bad shape {self.shape}")
        if math.prod(self.shape) * DTYPES[self.dtype] != len(self.data):
            raise ValueError(f"{what}: {len(self.data)} bytes do not fill shape {self.shape}")

    @classmethod
    def of_numpy(cls, array, floats: str = "float32") -> TensorData:
        """`array` as bytes; a float array in `floats` (float32, float16, or bfloat16,
        rounded to nearest even as torch's cast does)."""
        import numpy as np

        array = np.ascontiguousarray(array)
        if array.dtype.kind != "f":
            return cls(str(array.dtype), list(array.shape), array.tobytes())
        if floats == "bfloat16":
            bits = array.astype(np.float32).view(np.uint32)
            rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16  # (finite values: pixels)
            return cls("bfloat16", list(array.shape), rounded.astype(np.uint16).tobytes())
        if floats not in ("float32", "float16"):
            raise ValueError(f"floats must be float32, float16 or bfloat16, got {floats!r}")
        return cls(floats, list(array.shape), array.astype(floats).tobytes())

    def to_torch(self):
        import torch

        self.check("image tensor")
        dtype = getattr(torch, self.dtype)
        if not self.data:
            return torch.empty(self.shape, dtype=dtype)
        flat = torch.frombuffer(bytearray(self.data), dtype=dtype)
        return flat.reshape(self.shape)


class ImageInput(msgspec.Struct, array_like=True):
    content_hash: str  # hex sha256 of the tensors (hash_tensors)
    offset: int  # the first placeholder token's position in the prompt
    length: int  # placeholder tokens: the encoder's output rows for this image
    tensors: dict[str, TensorData]  # the processor's outputs for this image, by name

    @property
    def end(self) -> int:
        return self.offset + self.length

    def spans_only(self) -> ImageInput:
        """This image without its tensors: what the engine core keeps once the worker has
        them (the prefix cache needs only the hash and the span)."""
        return ImageInput(self.content_hash, self.offset, self.length, {})


def hash_tensors(tensors: dict[str, TensorData]) -> str:
    """A stable name for an image's processed pixels (and any grid sizes beside them)."""
    h = hashlib.sha256()
    for name in sorted(tensors):
        t = tensors[name]
        h.update(f"{name}:{t.dtype}:{t.shape};".encode())
        h.update(t.data)
    return h.hexdigest()


def check_images(
    images: list[ImageInput], prompt_token_ids: list[int], image_token_id: int | None
) -> None:
    """ValueError unless the images' spans are in order, inside the prompt, apart, and
    exactly the prompt's image tokens (a prompt may not carry an image token without an
    image behind it, nor an image without its placeholders)."""
    if images and image_token_id is None:
        raise ValueError("this model does not take images")
    if image_token_id is None:
        return
    end = 0
    for i, image in enumerate(images):
        if image.length <= 0 or image.offset < end or image.end > len(prompt_token_ids):
            raise ValueError(f"image {i}: its placeholder span is out of order or outside")
        if not _HEX64.fullmatch(image.content_hash):
            raise ValueError(f"image {i}: content_hash must be a hex sha256")
        for name, tensor in image.tensors.items():
            tensor.check(f"image {i}'s {name}")
        end = image.end
    covered = sum(image.length for image in images)
    placeholders = sum(1 for t in prompt_token_ids if t == image_token_id)
    if placeholders != covered or any(
        t != image_token_id for image in images for t in prompt_token_ids[image.offset : image.end]
    ):
        raise ValueError(
            f"the prompt's image tokens (id {image_token_id}) must be exactly the images' "
            "placeholders: send images through the chat API or multi_modal_data"
        )
