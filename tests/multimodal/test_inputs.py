"""What an image is on the wire, and how the caches key it: tensors are bytes of a stated
dtype and shape (never a pickle); a content hash names the pixels; a prompt's image tokens
must be exactly its images' spans; block hashes (and the radix tree's keys) of the blocks
under an image carry its hash, so one image's K/V is never another's."""

from __future__ import annotations

import numpy as np
import pytest

from cadence.core.hash_prefix_cache import make_block_hasher
from cadence.core.radix_cache import tree_tokens
from cadence.core.request import Request
from cadence.multimodal.inputs import ImageInput, TensorData, check_images, hash_tensors
from cadence.sampling_params import SamplingParams

IMG = 9


def _image(seed: int, offset: int, length: int) -> ImageInput:
    pixels = np.random.RandomState(seed).rand(1, 3, 4, 4).astype(np.float32)
    tensors = {"pixel_values": TensorData.of_numpy(pixels)}
    return ImageInput(hash_tensors(tensors), offset, length, tensors)


def test_tensor_data_round_trips_and_checks_its_bytes():
    array = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    data = TensorData.of_numpy(array)
    assert np.array_equal(data.to_torch().numpy(), array)
    with pytest.raises(ValueError, match="do not fill"):
        TensorData("float32", [2, 3, 5], data.data).check("x")
    with pytest.raises(ValueError, match="dtype"):
        TensorData("object", [1], b"\x00" * 8).check("x")


def test_the_hash_names_the_pixels():
    assert _image(0, 0, 1).content_hash == _image(0, 5, 2).content_hash
    assert _image(0, 0, 1).content_hash != _image(1, 0, 1).content_hash


def test_image_tokens_must_be_exactly_the_images_spans():
    prompt = [1, IMG, IMG, 2, IMG, IMG, 3]
    check_images([_image(0, 1, 2), _image(1, 4, 2)], prompt, IMG)
    bad = [
        ([_image(0, 1, 2)], "exactly"),  # an image token without its image
        ([_image(0, 1, 2), _image(1, 2, 2)], "out of order"),  # overlapping spans
        ([_image(0, 0, 2), _image(1, 4, 2)], "exactly"),  # a span over text tokens
        ([_image(0, 6, 2)], "outside"),
    ]
    for images, why in bad:
        with pytest.raises(ValueError, match=why):
            check_images(images, prompt, IMG)
    with pytest.raises(ValueError, match="does not take images"):
        check_images([_image(0, 1, 2)], prompt, None)


def _request(images, bs=4):
    prompt = [5, 6, IMG, IMG, IMG, IMG, 7, 8, 9, 10]
    return Request("r", prompt, SamplingParams(), block_hasher=make_block_hasher(bs), images=images)


def test_block_hashes_under_an_image_carry_its_hash():
    a, b = _request([_image(0, 2, 4)]), _request([_image(1, 2, 4)])
    plain = Request("p", a.prompt_token_ids, SamplingParams(), block_hasher=make_block_hasher(4))
    # Blocks [0, 4) and [4, 8) both hold image tokens: they differ, as all after them.
    assert a.block_hashes[0] != b.block_hashes[0] and a.block_hashes[1] != b.block_hashes[1]
    assert a.block_hashes[0] != plain.block_hashes[0]
    assert _request([_image(0, 2, 4)]).block_hashes == a.block_hashes


def test_radix_keys_put_the_image_in_the_tokens():
    a, b = _request([_image(0, 2, 4)]), _request([_image(1, 2, 4)])
    ka, kb = tree_tokens(a), tree_tokens(b)
    assert ka[:2] == kb[:2] == [5, 6] and ka[6:] == kb[6:]
    assert all(k < 0 for k in ka[2:6]) and ka[2:6] != kb[2:6]
    assert tree_tokens(Request("p", [1, 2, 3], SamplingParams())) == [1, 2, 3]


def test_float_tensors_travel_in_the_models_dtype_as_torch_would_cast_them():
    import torch

    values = np.random.RandomState(0).randn(4, 33).astype(np.float32) * 3
    for floats, dtype in (("bfloat16", torch.bfloat16), ("float16", torch.float16)):
        wire = TensorData.of_numpy(values, floats)
        assert wire.dtype == floats and len(wire.data) == values.size * 2
        assert torch.equal(wire.to_torch(), torch.from_numpy(values).to(dtype))
    grid = TensorData.of_numpy(np.array([[1, 4, 6]]), "bfloat16")  # integers stay as they are
    assert grid.dtype == "int64"
