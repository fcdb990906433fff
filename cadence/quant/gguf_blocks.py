"""GGUF's block formats, decoded into one shape: per group of `g` columns of a row,

    W[n, k] = s[n, k // g] * v[n, k] + c[n, k // g]      v: an unsigned integer code

exactly the values llama.cpp's dequantizers produce (float32 arithmetic on the fp16
scales). Every format the engine keeps packed reduces to it:

    format   g    v bits  s            c              bytes a block (elements)
    Q4_0     32   4       d            -8 d           18  (32)
    Q4_1     32   4       d            m              20  (32)
    Q5_0     32   5       d            -16 d          22  (32)
    Q5_1     32   5       d            m              24  (32)
    Q8_0     32   8       d            -128 d         34  (32; v = q + 128)
    Q4_K     32   4       d sc_j       -dmin m_j      144 (256 = 8 sub-blocks)
    Q5_K     32   5       d sc_j       -dmin m_j      176 (256)
    Q6_K     16   6       d sc_j       -32 d sc_j     210 (256 = 16 sub-blocks)

and from it into 4-bit planes, the one weight layout the kernels multiply by:

    v = 16 hi + lo  (hi, lo in 0..15)
    W = (16 s) (hi - 8) + s (lo - 8) + (136 s + c)      two planes, v up to 8 bits
    W = s (v - 8) + (8 s + c)                           one plane, v up to 4 bits

(each plane: nibbles q, a scale per group, the zeros summed into one term), which is the
form of torch's packed int4 kernel, `(q - 8) * scale + zero` per group.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

# format name -> (elements a block, bytes a block)
BLOCKS = {
    "Q4_0": (32, 18),
    "Q4_1": (32, 20),
    "Q5_0": (32, 22),
    "Q5_1": (32, 24),
    "Q8_0": (32, 34),
    "Q4_K": (256, 144),
    "Q5_K": (256, 176),
    "Q6_K": (256, 210),
}


@dataclass
class Codes:
    """A decoded weight [N, K]: W = s * v + c per group of `group` columns."""

    v: torch.Tensor  # uint8 [N, K]
    s: torch.Tensor  # float32 [N, K // group]
    c: torch.Tensor  # float32 [N, K // group]
    group: int
    bits: int  # the widest code: 4, 5, 6 or 8

    def dequantize(self) -> torch.Tensor:
        """The float32 weight [N, K]."""
        n, k = self.v.shape
        v = self.v.float().view(n, k // self.group, self.group)
        return (v * self.s[..., None] + self.c[..., None]).view(n, k)

    def rows(self, index: torch.Tensor) -> torch.Tensor:
        """Float32 rows W[index] (an embedding lookup), without expanding the rest."""
        n, k = self.v.shape
        v = self.v[index].float().view(-1, k // self.group, self.group)
        return (v * self.s[index][..., None] + self.c[index][..., None]).view(-1, k)


@dataclass
class Planes:
    """W = sum_p (q[p] - 8) * scale[p] + zero, per group: 4-bit planes of a Codes."""

    q: torch.Tensor  # uint8 [P, N, K], values 0..15
    scale: torch.Tensor  # float32 [P, N, K // group]
    zero: torch.Tensor  # float32 [N, K // group]
    group: int

    def dequantize(self) -> torch.Tensor:
        p, n, k = self.q.shape
        g = self.group
        w = (self.q.float().view(p, n, k // g, g) - 8) * self.scale[..., None]
        return (w.sum(0) + self.zero[..., None]).view(n, k)


def to_planes(codes: Codes) -> Planes:
    s, c = codes.s, codes.c
    if codes.bits <= 4:
        return Planes(codes.v[None], s[None], 8 * s + c, codes.group)
    hi, lo = codes.v >> 4, codes.v & 15
    return Planes(torch.stack([hi, lo]), torch.stack([16 * s, s]), 136 * s + c, codes.group)


def decode(kind: str, raw: np.ndarray, shape: tuple[int, int]) -> Codes:
    """Codes of a GGUF tensor: `raw` uint8 [N, row bytes] as stored, `shape` (N, K)."""
    if kind not in BLOCKS:
        raise ValueError(f"GGUF type {kind} is not decoded here")
    n, k = shape
    per, size = BLOCKS[kind]
    if k % per or raw.shape != (n, k // per * size):
        raise ValueError(f"{kind} data {raw.shape} does not hold a [{n}, {k}] weight")
    blocks = np.ascontiguousarray(raw).reshape(n, k // per, size)
    v, s, c, group, bits = _DECODERS[kind](blocks)
    nb = k // group
    return Codes(
        torch.from_numpy(np.ascontiguousarray(v.reshape(n, k), dtype=np.uint8)),
        torch.from_numpy(np.ascontiguousarray(s.reshape(n, nb), dtype=np.float32)),
        torch.from_numpy(np.ascontiguousarray(c.reshape(n, nb), dtype=np.float32)),
        group,
        bits,
    )


def _f16(b: np.ndarray) -> np.ndarray:
    """Little-endian fp16 from the last axis's 2 bytes, as float32."""
    return np.ascontiguousarray(b).view(np.float16)[..., 0].astype(np.float32)


def _nibbles_32(qs: np.ndarray) -> np.ndarray:
    """16 bytes -> 32 codes: element j is the low nibble of byte j, j + 16 its high one."""
    return np.concatenate([qs & 15, qs >> 4], axis=-1)


def _high_bits_32(qh: np.ndarray) -> np.ndarray:
    """A little-endian uint32 of 4 bytes -> its 32 bits, element j = bit j."""
    return np.unpackbits(qh, axis=-1, bitorder="little")


def _q4_0(b):
    d = _f16(b[..., 0:2])
    return _nibbles_32(b[..., 2:18]), d, -8 * d, 32, 4


def _q4_1(b):
    d, m = _f16(b[..., 0:2]), _f16(b[..., 2:4])
    return _nibbles_32(b[..., 4:20]), d, m, 32, 4


def _q5_0(b):
    d = _f16(b[..., 0:2])
    v = _nibbles_32(b[..., 6:22]) | (_high_bits_32(b[..., 2:6]) << 4)
    return v, d, -16 * d, 32, 5


def _q5_1(b):
    d, m = _f16(b[..., 0:2]), _f16(b[..., 2:4])
    v = _nibbles_32(b[..., 8:24]) | (_high_bits_32(b[..., 4:8]) << 4)
    return v, d, m, 32, 5


def _q8_0(b):
    d = _f16(b[..., 0:2])
    q = np.ascontiguousarray(b[..., 2:34]).view(np.int8).astype(np.int16)
    return (q + 128).astype(np.uint8), d, -128 * d, 32, 8


def _k_scales(sc: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K / Q5_K: 12 bytes -> 8 six-bit scales and 8 six-bit mins (sub-blocks 0..7)."""
    sc = sc.astype(np.uint8)
    scales = np.empty(sc.shape[:-1] + (8,), np.uint8)
    mins = np.empty_like(scales)
    scales[..., :4] = sc[..., 0:4] & 63
    mins[..., :4] = sc[..., 4:8] & 63
    scales[..., 4:] = (sc[..., 8:12] & 15) | ((sc[..., 0:4] >> 6) << 4)
    mins[..., 4:] = (sc[..., 8:12] >> 4) | ((sc[..., 4:8] >> 6) << 4)
    return scales.astype(np.float32), mins.astype(np.float32)


def _k_low_nibbles(qs: np.ndarray) -> np.ndarray:
    """128 bytes -> 256 codes: each 32-byte chunk j gives elements 64j..64j+31 (low
    nibbles) then 64j+32..64j+63 (high nibbles)."""
    q = qs.reshape(qs.shape[:-1] + (4, 32))
    return np.stack([q & 15, q >> 4], axis=-2).reshape(qs.shape[:-1] + (256,))


def _q4_k(b):
    d, dmin = _f16(b[..., 0:2]), _f16(b[..., 2:4])
    scales, mins = _k_scales(b[..., 4:16])
    v = _k_low_nibbles(b[..., 16:144])
    return v, d[..., None] * scales, -dmin[..., None] * mins, 32, 4


def _q5_k(b):
    d, dmin = _f16(b[..., 0:2]), _f16(b[..., 2:4])
    scales, mins = _k_scales(b[..., 4:16])
    bits = np.unpackbits(b[..., 16:48], axis=-1, bitorder="little").reshape(
        b.shape[:-1] + (32, 8)
    )  # [.., l, bit i]: bit i of qh[l] is the fifth bit of element 32 i + l
    high = np.swapaxes(bits, -1, -2).reshape(b.shape[:-1] + (256,))
    v = _k_low_nibbles(b[..., 48:176]) | (high << 4)
    return v, d[..., None] * scales, -dmin[..., None] * mins, 32, 5


def _q6_k(b):
    ql, qh = b[..., 0:128], b[..., 128:192]
    sc = np.ascontiguousarray(b[..., 192:208]).view(np.int8).astype(np.float32)
    d = _f16(b[..., 208:210])
    out = []
    for half in range(2):  # each half: 128 elements from 64 ql bytes and 32 qh bytes
        lq = ql[..., 64 * half : 64 * half + 64]
        hq = qh[..., 32 * half : 32 * half + 32]
        out += [
            (lq[..., :32] & 15) | ((hq & 3) << 4),
            (lq[..., 32:] & 15) | (((hq >> 2) & 3) << 4),
            (lq[..., :32] >> 4) | (((hq >> 4) & 3) << 4),
            (lq[..., 32:] >> 4) | (((hq >> 6) & 3) << 4),
        ]
    v = np.concatenate(out, axis=-1)
    s = d[..., None] * sc
    return v, s, -32 * s, 16, 6


_DECODERS = {
    "Q4_0": _q4_0,
    "Q4_1": _q4_1,
    "Q5_0": _q5_0,
    "Q5_1": _q5_1,
    "Q8_0": _q8_0,
    "Q4_K": _q4_k,
    "Q5_K": _q5_k,
    "Q6_K": _q6_k,
}
