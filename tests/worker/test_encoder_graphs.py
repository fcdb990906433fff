"""The vision encoder of one image in a CUDA graph (worker/encoder_graphs.py). On the CPU:
each family's graph body (what a graph captures: no host data) gives exactly what its eager
encode gives, for images of several sizes (Qwen-VL: other grids, Qwen2.5-VL's uneven
windows), and a batch of several images has no graph. On a GPU: replays equal eager
encodes, one graph per key up to the limit, the rest eager."""

from __future__ import annotations

import pytest
import torch
from vision_helpers import PLACEHOLDERS, random_image

from cadence import LLM

KINDS = ["llava", "qwen2_vl", "qwen2_5_vl", "idefics3", "gemma3"]
SIZES = [(40, 50), (90, 20), (64, 64)]


def _engine(kind: str, path: str):
    # (a small pool: on a GPU the earlier tests' engines may still hold theirs)
    llm = LLM(path, dtype="float32", enable_prefix_caching=False, num_gpu_blocks_override=64)
    return llm, llm.engine.runner.driver.model


def _images(llm, kind: str, size: tuple[int, int], seed: int):
    """The ImageInputs of one picture (Idefics3: its tiles and overview, each an image)."""
    _, images = llm.images.read(f"look: {PLACEHOLDERS[kind]}", [random_image(*size, seed)])
    return images


@pytest.mark.parametrize("kind", KINDS)
def test_graph_body_equals_the_eager_encode(kind, tiny_vision_model_dir):
    llm, model = _engine(kind, tiny_vision_model_dir(kind))
    keys = set()
    for seed, size in enumerate(SIZES):
        images = _images(llm, kind, size, seed)
        key, pixels = model.graph_input(images[:1])
        keys.add(key)
        with torch.inference_mode():
            got = model.graph_body(key)(pixels)
        assert torch.equal(got, model.encode_images(images[:1])[0])
    if kind.startswith("qwen"):
        assert len(keys) == len(SIZES)  # one graph per patch grid
    two = _images(llm, kind, SIZES[0], 7) + _images(llm, kind, SIZES[1], 8)
    assert model.graph_input(two) is None


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("kind", ["qwen2_5_vl", "gemma3"])
def test_replays_equal_eager_encodes(kind, tiny_vision_model_dir):
    from cadence.worker.encoder_graphs import EncoderGraphs

    llm, model = _engine(kind, tiny_vision_model_dir(kind))
    assert llm.engine.runner.driver.images.graphs is not None  # on by default on a GPU
    graphs = EncoderGraphs(model, torch.device("cuda"), max_graphs=2)
    results = []
    for seed, size in enumerate(SIZES * 2):
        images = _images(llm, kind, size, seed)
        got = graphs.encode(images[:1])
        results.append(got is not None)
        if got is not None:
            torch.testing.assert_close(got[0], model.encode_images(images[:1])[0])
    if kind == "gemma3":  # one size: one graph, every image replays it
        assert all(results) and len(graphs.graphs) == 1
    else:  # three grids, two graphs: the third runs eagerly
        assert results == [True, True, False] * 2 and len(graphs.graphs) == 2
    two = _images(llm, kind, SIZES[0], 9) + _images(llm, kind, SIZES[1], 10)
    assert graphs.encode(two) is None
