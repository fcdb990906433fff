"""How many partitions a split-KV decode launch takes (cadence/attention/triton_split_kv.py).
The kernels themselves are checked against the torch reference in test_triton_paged.py."""

from __future__ import annotations

import importlib.util

import pytest

needs_triton = pytest.mark.skipif(
    importlib.util.find_spec("triton") is None, reason="triton is not installed"
)


@needs_triton
def test_split_kv_parts_rule() -> None:
    """Powers of two that bring a launch to about two programs per SM; none when the
    decodes alone cover the SMs; never past what the reduce kernel holds."""
    from cadence.attention.triton_split_kv import MAX_SPLIT_PARTS, split_kv_parts

    assert [split_kv_parts(b, 8, 132) for b in (1, 2, 4, 8, 16, 17, 64)] == [32, 16, 8, 4, 2, 0, 0]
    assert split_kv_parts(1, 1, 132) == MAX_SPLIT_PARTS
    assert split_kv_parts(0, 8, 132) == 0
    for b in range(1, 40):
        parts = split_kv_parts(b, 4, 108)
        assert parts == 0 or (parts & (parts - 1) == 0 and b * 4 * parts <= 2 * 108)
