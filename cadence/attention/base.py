"""The attention backend seam: what the model runner builds once a step, and what every
attention layer calls.

The device never sees a request, only token positions and block tables:

    query tokens  [T]          the step's tokens, requests back to back (prefill chunks and
                               single decode tokens mixed, in any order)
    query_start_loc [B+1]      request b owns query tokens [qsl[b], qsl[b+1])
    seq_lens      [B]          tokens with K/V once this step is written (context + query)
    slot_mapping  [T]          flat cache slot (block_id * block_size + offset) of each token
    block_tables  [B, max_blocks]  physical block ids, in order
    key_limits    [T] or None  the last key position each query token sees: its own
                               position (causal), or later for a token of an image its
                               model attends both ways (Gemma 3); None: causal throughout

KV cache layout per layer: [2, num_blocks, block_size, num_kv_heads, head_dim], in the
model's dtype or in FP8 (e4m3): then a slot holds k / k_scale and v / v_scale (the layer's
scales, saturated at 448) and every reader widens the tiles and multiplies the scales back.
"""

from __future__ import annotations

import abc
import dataclasses
from dataclasses import dataclass

import torch

FP8_KV_DTYPE = torch.float8_e4m3fn
FP8_MAX = 448.0


def is_fp8(dtype: torch.dtype) -> bool:
    return dtype == FP8_KV_DTYPE


@dataclass
class AttentionMetadata:
    num_tokens: int
    query_start_loc: torch.Tensor  # [B+1] int64, on the device
    seq_lens: torch.Tensor  # [B] int64
    slot_mapping: torch.Tensor  # [T] int64
    block_tables: torch.Tensor  # [B, max_blocks] int64
    # Host copies, for backends that plan on the CPU.
    query_lens_cpu: list[int]
    seq_lens_cpu: list[int]
    block_size: int
    backend_data: object = None  # whatever the backend precomputed in build()
    # [T] int32 on the device, and its host copy (int64): see the module docstring. Only
    # a backend with capabilities.key_limits is handed them.
    key_limits: torch.Tensor | None = None
    key_limits_cpu: torch.Tensor | None = None
    # Per KV group (worker/kv_groups.py), the same step over that group's blocks: a layer
    # of group g reads groups[g]. None: one group, every layer reads this.
    groups: list[AttentionMetadata] | None = None


@dataclass(frozen=True)
class BackendCapabilities:
    """What a backend can do beyond `build` and `forward`, declared as data: the runner
    and the drafters read these, never probe for methods."""

    decode_graphs: bool = False  # decode_plan(): decode steps replay captured CUDA graphs
    mixed_graphs: bool = False  # mixed_graph_plan(): prefill/mixed steps replay them too
    split_kv: bool = False  # graph_split_parts(): long contexts split across programs
    fp8_kv: bool = True  # reads and writes an FP8 (e4m3) KV cache
    sliding_window: bool = False  # forward(window=W): a query sees only its last W keys
    softcap: bool = False  # forward(softcap=c): scores pass through c * tanh(score / c)
    sinks: bool = False  # forward(sinks=s): a logit per head that joins each softmax sum
    key_limits: bool = False  # meta.key_limits: a query may see keys after its own position
    # forward(head_norm=(q_w, k_w, eps, gemma)): an RMSNorm over each head of q and k before
    # the backend rotates them (the model then skips its own q / k norm launches)
    head_norm: bool = False


class AttentionBackend(abc.ABC):
    """Subclasses fill in `build` (once a step) and `forward` (once a layer), and declare
    `capabilities`; a capability's methods below are theirs to override."""

    name = "base"
    capabilities = BackendCapabilities()

    def build(self, meta: AttentionMetadata) -> AttentionMetadata:
        return meta

    def for_group(
        self, meta: AttentionMetadata, block_tables: torch.Tensor, slot_mapping: torch.Tensor
    ) -> AttentionMetadata:
        """A built step's metadata for another KV group: the same queries and lengths over
        that group's blocks. (Planned again here; a backend whose plan never reads the
        tables shares it.)"""
        view = dataclasses.replace(
            meta, block_tables=block_tables, slot_mapping=slot_mapping, backend_data=None
        )
        return self.build(view)

    @abc.abstractmethod
    def forward(
        self,
        q: torch.Tensor,  # [T, Hq, D]
        k: torch.Tensor,  # [T, Hkv, D]
        v: torch.Tensor,  # [T, Hkv, D]
        kv_cache: torch.Tensor,  # [2, num_blocks, block_size, Hkv, D]
        meta: AttentionMetadata,
        scale: float,
        rotary: tuple[torch.Tensor, torch.Tensor] | None = None,
        kv_scale: tuple[float, float] = (1.0, 1.0),
        *,
        window: int | None = None,
        softcap: float | None = None,
        sinks: torch.Tensor | None = None,
    ) -> torch.Tensor:  # [T, Hq, D]
        """Rotate q and k by `rotary` (cos, sin [T, 1, D], rotate-half; None: already
        rotated), write k/v into their slots, then attend each query token to its context.
        q and k may be rotated in place. `kv_scale` (k_scale, v_scale) applies to an FP8
        cache only. `window` W (a sliding-window layer): the query at position p sees keys
        at positions p - W < j <= p, as transformers counts it. `softcap` c: each score s
        becomes c * tanh(s / c) before the mask and softmax (Gemma 2). `sinks` [Hq] float32
        (GPT-OSS): head h's softmax denominator gains e^sinks[h], a key that attends to
        nothing (so a row's weights may sum to less than 1). Each only where the backend's
        capabilities say so (the model checks when it is built)."""

    def forward_latent(
        self,
        q: torch.Tensor,  # [T, Hq, D]: each head's absorbed query (latent dims, then rope)
        latent: torch.Tensor,  # [T, 1, D]: each token's latent, the one key every head reads
        kv_cache: torch.Tensor,  # [2, num_blocks, block_size, 1, D], both halves one tensor
        meta: AttentionMetadata,
        scale: float,
        value_dim: int,
    ) -> torch.Tensor:  # [T, Hq, value_dim]
        """Multi-head latent attention (models/mla.py): write `latent` into its slots, then
        attend every query head to the latents of its context, the latent's first
        `value_dim` dims being the value. Here as one-head attention with K = V = latent,
        keeping the output's first value_dim dims; a backend with a kernel of its own
        overrides it."""
        return self.forward(q, latent, latent, kv_cache, meta, scale)[..., :value_dim]

    # ---- capabilities (see BackendCapabilities) ----------------------------------------

    def decode_plan(self, num_reqs: int, device: torch.device, split: bool = False):
        """A decode step's plan with static shapes, for graph capture (decode_graphs)."""
        raise NotImplementedError(f"the {self.name} backend has no graph-safe decode")

    def mixed_graph_plan(self, work_req: torch.Tensor, work_qoff: torch.Tensor):
        """A mixed step's plan over fixed work buffers, for graph capture (mixed_graphs)."""
        raise NotImplementedError(f"the {self.name} backend has no graph-safe mixed step")

    def graph_split_parts(self, num_reqs: int, device: torch.device) -> int:
        """How many parts a captured decode splits long contexts into (split_kv); 0: none."""
        return 0
