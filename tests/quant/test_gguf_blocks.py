"""GGUF block formats decode to exactly what the reference dequantizer (the gguf package,
a port of llama.cpp's) produces, and the 4-bit planes the kernels use hold the same values."""

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType
from gguf.quants import dequantize

from cadence.quant.gguf_blocks import BLOCKS, decode, to_planes

# byte offsets of each block's fp16 fields (random bytes there could be inf or NaN)
_F16_FIELDS = {
    "Q4_0": (0,),
    "Q4_1": (0, 2),
    "Q5_0": (0,),
    "Q5_1": (0, 2),
    "Q8_0": (0,),
    "Q4_K": (0, 2),
    "Q5_K": (0, 2),
    "Q6_K": (208,),
}


def random_blocks(kind: str, n: int, k: int, seed: int = 0) -> np.ndarray:
    per, size = BLOCKS[kind]
    rng = np.random.default_rng(seed)
    raw = rng.integers(0, 256, (n, k // per, size), dtype=np.uint8)
    for at in _F16_FIELDS[kind]:
        halves = rng.uniform(-0.05, 0.05, (n, k // per)).astype(np.float16)
        raw[..., at : at + 2] = halves.view(np.uint8).reshape(n, k // per, 2)
    return raw.reshape(n, -1)


@pytest.mark.parametrize("kind", sorted(BLOCKS))
def test_decode_matches_reference_dequantizer(kind):
    n, k = 8, 512
    raw = random_blocks(kind, n, k)
    expected = dequantize(raw, GGMLQuantizationType[kind]).reshape(n, k)
    codes = decode(kind, raw, (n, k))
    np.testing.assert_allclose(codes.dequantize().numpy(), expected, rtol=1e-6, atol=1e-7)
    rows = torch.tensor([5, 0, 5])
    np.testing.assert_allclose(codes.rows(rows).numpy(), expected[[5, 0, 5]], rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("kind", sorted(BLOCKS))
def test_planes_hold_the_same_weight(kind):
    n, k = 4, 256
    codes = decode(kind, random_blocks(kind, n, k, seed=1), (n, k))
    planes = to_planes(codes)
    assert planes.q.max() <= 15
    assert planes.q.shape[0] == (1 if codes.bits <= 4 else 2)
    # Same values up to float32 rounding: the planes' zero (136 s + c) cancels against the
    # high plane's offset, so the error is a few ulps of 136 s, not of W.
    w = codes.dequantize()
    tol = 8 * 136 * codes.s.abs().max().item() * torch.finfo(torch.float32).eps
    torch.testing.assert_close(planes.dequantize(), w, rtol=0, atol=tol)


def test_wrong_sizes_are_refused():
    raw = random_blocks("Q4_0", 2, 64)
    with pytest.raises(ValueError, match="does not hold"):
        decode("Q4_0", raw, (2, 96))
    with pytest.raises(ValueError, match="not decoded"):
        decode("IQ2_XS", raw, (2, 64))
