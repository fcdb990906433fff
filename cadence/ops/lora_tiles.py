"""How a step's LoRA tokens are cut into tiles: shared by the plan (cadence/lora/batch.py)
and the Triton kernels that read it (lora_kernels.py), without importing Triton."""

from __future__ import annotations

BLOCK_M = 16  # tokens per tile (tl.dot's smallest tile)


def max_tiles(num_tokens: int, num_slots: int) -> int:
    """Tiles a plan of `num_tokens` tokens over `num_slots` slots can need: every slot's
    run may end in a partial tile. The kernels' grid: fixed for a given token count."""
    return -(-num_tokens // BLOCK_M) + min(num_slots, num_tokens)
