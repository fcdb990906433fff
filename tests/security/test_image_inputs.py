"""The attacker owns an image's wire form (a compromised or buggy API process, a crafted
frame): tensors whose bytes do not fill their shape, dtypes that are not numbers, shapes
the encoder cannot take, hashes that are not hashes, spans that miss the placeholders.
Each is a ValueError at admission, before the block hasher or the encoder sees it, and the
engine goes on serving; a frame of the wrong types does not decode at all."""

from __future__ import annotations

import msgspec
import numpy as np
import pytest
from vision_helpers import IMAGE_TOKEN_ID

from cadence import LLM, SamplingParams
from cadence.engine import protocol as P
from cadence.multimodal.inputs import ImageInput, TensorData, hash_tensors

PROMPT = [1, 2, *([IMAGE_TOKEN_ID] * 16), 3]
PARAMS = SamplingParams(temperature=0.0, max_tokens=2, ignore_eos=True)


def _pixels(shape=(1, 3, 32, 32), dtype="float32") -> TensorData:
    return TensorData.of_numpy(np.zeros(shape, dtype=dtype))


def _image(tensors, offset=2, length=16, content_hash=None) -> ImageInput:
    return ImageInput(content_hash or hash_tensors(tensors), offset, length, tensors)


@pytest.fixture(scope="module")
def engine(tiny_vision_model_dir):
    return LLM(tiny_vision_model_dir("llava"), dtype="float32").engine


FORGED = {
    "short bytes": [_image({"pixel_values": TensorData("float32", [1, 3, 32, 32], b"\0" * 8)})],
    "object dtype": [_image({"pixel_values": TensorData("object", [1], b"\0" * 8)})],
    "huge shape": [_image({"pixel_values": TensorData("float32", [2**40, 2**30], b"")})],
    "wrong size": [_image({"pixel_values": _pixels((1, 3, 64, 64))})],
    "no pixels": [_image({"grid": _pixels((1, 3))})],
    "bad hash": [_image({"pixel_values": _pixels()}, content_hash="zz" * 32)],
    "short span": [_image({"pixel_values": _pixels()}, length=15)],
    "off the prompt": [_image({"pixel_values": _pixels()}, offset=10)],
    "none for the placeholders": [],
}


@pytest.mark.parametrize("case", sorted(FORGED))
def test_forged_images_are_refused_at_admission(engine, case):
    with pytest.raises(ValueError):
        engine.add_request(f"forged-{case}", PROMPT, PARAMS, images=FORGED[case])
    assert not engine.scheduler.requests


def test_the_engine_serves_on_after_the_forgeries(engine):
    good = [_image({"pixel_values": _pixels()})]
    engine.add_request("honest", PROMPT, PARAMS, images=good)
    while engine.has_unfinished_requests():
        engine.step()
    assert not engine.scheduler.requests


def test_a_frame_of_the_wrong_types_does_not_decode():
    good = P.EngineCoreRequest(
        "r", PROMPT, PARAMS, 0.0, images=[_image({"pixel_values": _pixels()})]
    )
    raw = msgspec.msgpack.decode(P.encoder.encode(good))
    raw[7][0][3] = {"pixel_values": "not a tensor"}  # (array_like: images is field 7)
    with pytest.raises(msgspec.ValidationError):
        P.request_decoder.decode(msgspec.msgpack.encode(raw))
