"""An embedding model's vector, from the engine's raw pooled state to what a user gets:
cut to the `dimensions` asked for (Matryoshka models only), then L2-normalized when the
model's pooling says so. Shared by /v1/embeddings and LLM.embed.

An embedding request runs in the engine as a prompt with one greedy token to sample (its
vector rides on that token's update), so it is scheduled like any prefill and its KV
blocks are released, or left to the prefix cache, when that token comes back.
"""

from __future__ import annotations

import numpy as np

from cadence.config import PoolingSpec
from cadence.sampling_params import SamplingParams


def embedding_params() -> SamplingParams:
    """What the engine runs an embedding request with: the prompt, then one greedy token."""
    return SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True)


def check_dimensions(spec: PoolingSpec, dimensions: int | None) -> None:
    """ValueError unless the model can give vectors of `dimensions` (None: the full length)."""
    if dimensions is None or dimensions == spec.hidden_size:
        return
    if dimensions < 1:
        raise ValueError("dimensions must be a positive integer")
    allowed = spec.matryoshka_dimensions
    if spec.any_dimensions and dimensions <= spec.hidden_size:
        return
    if allowed and dimensions in allowed:
        return
    if allowed or spec.any_dimensions:
        raise ValueError(
            f"dimensions {dimensions} is not one this model was trained for: "
            f"{allowed or f'1 to {spec.hidden_size}'}"
        )
    raise ValueError(
        f"this model gives {spec.hidden_size}-dimensional vectors only (it is not a "
        "Matryoshka model: its config names no matryoshka_dimensions)"
    )


def finish_embedding(raw: bytes, spec: PoolingSpec, dimensions: int | None) -> np.ndarray:
    """The user's vector (float32) from the engine's pooled state."""
    vec = np.frombuffer(raw, dtype=np.float32)
    if dimensions is not None:
        vec = vec[:dimensions]
    if spec.normalize:
        vec = vec / max(float(np.linalg.norm(vec)), 1e-12)
    return vec.astype(np.float32, copy=False)
