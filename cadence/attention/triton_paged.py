"""Paged attention in Triton: one backend for mixed batches of prefill chunks and decodes.

The kernels live in triton_write_kv.py (A), triton_kernels.py (B) and triton_split_kv.py
(C); this module plans a step (build, once a step) and launches them (forward, once a
layer). Latent attention (DeepSeek's; forward_latent) runs A, then triton_mla.py's kernel
over B's plan.

  A  write_kv_kernel         grid (T,)
     one program per new token: rotate its q heads in place (rotary, rotate-half layout)
     and copy its K (rotated) and V rows, all KV heads, into the token's cache slot. Runs
     first, so the attention below reads this step's keys from the cache like any other
     key (no special case for "new" keys).

  B  paged_attention_kernel  grid (work items, Hkv, sub-tiles)
     A work item is up to work_q consecutive query tokens of one request, planned in
     build(). The program (item, kv head h, sub-tile s) owns TOK query tokens of the item
     and all G query heads that share kv head h, stacked as the tile's rows:

                 query rows (BLOCK_M = TOK * G_PAD)     context of the request
                 +--------------------------+      block table -> [b7][b2][b9][b4] ...
        tok 0    | head h*G+0 ... h*G+G-1   |              BLOCK_N keys per step
        tok 1    | head h*G+0 ... h*G+G-1   |      ------> S = Q K^T, causal mask,
         ...     |          ...             |              online softmax, acc += P V
        tok TOK-1| ...                      |
                 +--------------------------+

     so each K/V tile is loaded once for the whole GQA group and reused by every query
     token of the tile. Keys are visited in tiles of BLOCK_N positions; each position's
     physical block comes from the block table (a gather, so any block size works).
     Tiles: a decode-only step (every item one token) runs BLOCK_M = max(16, G_PAD) rows
     (G_PAD: group size rounded up to a power of two) with launch settings by batch size
     (decode_launch). Any other step runs MAX_BLOCK_M-row tiles; programs that own few
     rows (decodes in a mixed batch) take the 16-row path instead: both are compiled into
     the same kernel and chosen per program at run time, so a mixed batch is still one
     launch without decodes paying for big tiles. An item of work_q tokens is covered by
     cdiv(work_q, TOK) sub-tile programs (grid axis 2), since build() plans items before
     it knows the group size.

  C  split_kv_kernel + split_kv_reduce_kernel   grid (split decodes, Hkv, partitions)
     Flash-decoding for few decodes with long contexts (see triton_split_kv.py). build()
     sends a step's decodes there when `split_kv_parts` says they are too few to cover
     the SMs, the longest decode context is >= split_min_context and the step's prefill
     tokens are too few to fill the GPU themselves. CUDA graphs of small decode batches
     capture a split variant too (`decode_plan(n, split=True)`).

Every variant the kernels compile (per dtype and model shape) is a function of the tile
kind alone: decode-small, decode-large, prefill/mixed, split, reduce; integer arguments
that vary from step to step are `do_not_specialize`. cadence/worker/warmup.py runs each
at start-up, so no kernel compiles in the middle of serving.

Accumulation is fp32 throughout; the output has q's dtype. Masked keys get score -inf and
their K/V loads are masked to zero, and the running max starts at a finite -1e30, so no
padded or uninitialised cache slot can turn into NaN.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from cadence.attention import triton_mla, triton_split_kv
from cadence.attention.base import (
    AttentionBackend,
    AttentionMetadata,
    BackendCapabilities,
    is_fp8,
)
from cadence.attention.triton_kernels import NO_WINDOW, paged_attention_kernel
from cadence.attention.triton_write_kv import HeadNorm, write_kv
from cadence.ops.fused import INTERPRETER as _INTERPRETER
from cadence.ops.fused import pdl

LOG2E = 1.4426950408889634
MAX_WORK_Q = 64  # most query tokens in one work item of kernel B
MAX_HEAD_DIM = 256  # widest head the tiles fit in shared memory
DEFAULT_NUM_SMS = 132  # H100/H200; used when the device is not CUDA (interpreter, tests)


# Kernel B's prefill/mixed tile, from benchmarks/split_kv_sweep.py's prefill sweep on an
# H200 (32/8 heads, head_dim 128, bf16). Module constants, so a sweep can set them.
MAX_BLOCK_M = 64  # rows (query tokens x group heads) of kernel B's prefill tile
BLOCK_N = 64  # keys per inner step of kernel B
PREFILL_NUM_WARPS = 4
PREFILL_NUM_STAGES = 2
PREFILL_TWO_PHASE = True  # the prefill tile's unmasked first phase (triton_kernels.attend)
# Kernel B when every work item is one decode token (decode steps, CUDA graphs), 16-bit
# caches: (BLOCK_N, num_warps, num_stages) by batch size, from benchmarks/kernel_sweep.py on
# an H200. Few decodes run few programs, each over its whole context: wide key tiles halve
# their serial steps (batch 1: 9.1 -> 6.9 us a layer at 141 keys, 14.7 -> 8.9 at 384).
# Many decodes fill the GPU: narrow tiles, 2 warps and a third stage hold ~4 TB/s.
DECODE_LARGE_BATCH = 32  # decodes from which the "large" settings apply
DECODE_SMALL = (128, 4, 2)
DECODE_LARGE = (64, 2, 3)
WIDE_HEAD_DIM = 256  # heads from this width on take the settings measured for Gemma's
# Wide heads, many decodes (benchmarks/decode_wide_heads.py --large, Gemma-2-9B's 16/8 heads
# of 256): batch 64 at 138 keys 49.0 -> 30.6 us, at 1,280 keys 267 -> 171 us against the
# (64, 2, 3) the 128-wide settings scaled to (its three 64 KB stages held one program an SM).
DECODE_WIDE_LARGE = (64, 2, 1)


def decode_launch(num_decodes: int, head_dim: int) -> tuple[int, int, int]:
    if head_dim >= WIDE_HEAD_DIM and num_decodes >= DECODE_LARGE_BATCH:
        return DECODE_WIDE_LARGE
    block_n, warps, stages = DECODE_LARGE if num_decodes >= DECODE_LARGE_BATCH else DECODE_SMALL
    if head_dim >= WIDE_HEAD_DIM and num_decodes < DECODE_LARGE_BATCH:
        warps = 8  # Gemma-2-9B, batch 1: 6.09 ms a step against 6.25 with 4
    # Tuned at head_dim 128; wider heads would overflow shared memory with 128-key tiles.
    return min(block_n, 128 * 128 // max(head_dim, 128)), warps, stages


def _tile_config(dtype: torch.dtype, head_dim: int) -> tuple[int, int, int]:
    """(BLOCK_N, num_warps, num_stages) of kernel B for its prefill tile."""
    block_n = BLOCK_N
    if dtype == torch.float32 and head_dim > 64:
        block_n = min(block_n, 32)  # fp32 tiles are twice the registers and shared memory
    return block_n, PREFILL_NUM_WARPS, PREFILL_NUM_STAGES


def _next_pow2(n: int) -> int:
    return 1 << max(0, int(n) - 1).bit_length()


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def work_items(query_lens: torch.Tensor, work_q: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Kernel B's work items for a step's query lengths ([B] int64, on the host): each
    request's tokens in chunks of work_q. Returns (request, first token within it) per
    item; a request of 0 tokens has none (callers pass 0 for requests B leaves out)."""
    items = (query_lens + work_q - 1) // work_q
    work_req = torch.repeat_interleave(torch.arange(query_lens.numel()), items)
    first = torch.cumsum(items, 0) - items
    return work_req, (torch.arange(work_req.numel()) - first[work_req]) * work_q


@dataclass
class TritonPlan:
    """What build() planned for a step; shared by every layer's forward."""

    work_req: torch.Tensor  # [N] int32 request of each kernel-B work item
    work_qoff: torch.Tensor  # [N] int32 first query token of the item, within its request
    work_q: int  # query tokens per work item (power of two)
    split_req: torch.Tensor  # [S] int32 decode requests that take the split-KV path
    num_parts: int  # split-KV partitions per context (0: no split-KV launch)


class TritonAttentionBackend(AttentionBackend):
    """Paged attention in Triton kernels. See the module docstring for the kernels.

    `num_kv_heads`, `num_sms` and `head_dim` only steer the split-KV rule in build(),
    which runs before any layer (so before the heads are seen): all have H200/Llama-8B-like
    defaults. `split_kv` forces the split path on (every decode) or off; None lets the
    rule choose. `split_min_partition` is the shortest partition (keys) a split makes;
    `split_min_context` the shortest decode context worth splitting (None: by head_dim).
    """

    name = "triton"
    capabilities = BackendCapabilities(
        decode_graphs=True,
        mixed_graphs=True,
        split_kv=True,
        sliding_window=True,
        softcap=True,
        sinks=True,
        key_limits=True,
        head_norm=True,
    )
    MIXED_GRAPH_WORK_Q = MAX_WORK_Q  # query tokens per work item in mixed-step graphs

    def __init__(
        self,
        num_kv_heads: int = 8,
        num_sms: int | None = None,
        split_kv: bool | None = None,
        split_min_partition: int | None = None,
        split_min_context: int | None = None,
        head_dim: int = 128,
    ) -> None:
        self.num_kv_heads = num_kv_heads
        self.num_sms = num_sms
        self.split_kv = split_kv
        # Wide heads (Gemma's 256) move twice the bytes a key and run a decode's few
        # programs twice as long: splitting pays from far shorter contexts (on an H200,
        # Gemma-2-9B at batch 1, 128 -> 384 tokens: 5.94 ms a step split from 128 keys
        # in partitions of 64, against 6.25 unsplit; benchmarks/decode_wide_heads.py).
        wide = head_dim >= WIDE_HEAD_DIM
        if split_min_partition is None:
            split_min_partition = 64 if wide else 256
        if split_min_context is None:
            split_min_context = 128 if wide else 1024
        self.split_min_partition = split_min_partition
        self.split_min_context = split_min_context

    # ---- once a step ------------------------------------------------------------------

    def _sm_count(self, device: torch.device) -> int:
        if self.num_sms is None:
            if device.type == "cuda":
                props = torch.cuda.get_device_properties(device)
                self.num_sms = props.multi_processor_count
            else:
                return DEFAULT_NUM_SMS
        return self.num_sms

    def split_parts(
        self,
        num_decodes: int,
        max_decode_context: int,
        num_prefill_tokens: int,
        device: torch.device,
    ) -> int:
        """Split-KV partitions for a step's decodes (0: no split): the rule build() and the
        CUDA graphs share."""
        if not num_decodes or self.split_kv is False:
            return 0
        parts = triton_split_kv.split_kv_parts(
            num_decodes, self.num_kv_heads, self._sm_count(device)
        )
        if self.split_kv:  # forced on: split even where the rule would not
            return max(parts, 2)
        long_enough = max_decode_context >= self.split_min_context
        # a batch that also carries prefill work fills the GPU by itself
        return parts if long_enough and num_prefill_tokens < self._sm_count(device) else 0

    def build(self, meta: AttentionMetadata) -> AttentionMetadata:
        if meta.block_size < 1:
            raise ValueError(f"block_size must be positive, got {meta.block_size}")
        device = meta.slot_mapping.device
        # Host planning on small int tensors, vectorised; one host-to-device copy at the end.
        qlens = torch.tensor(meta.query_lens_cpu, dtype=torch.int64)
        slens = torch.tensor(meta.seq_lens_cpu, dtype=torch.int64)
        num_reqs = qlens.numel()

        is_decode = qlens == 1
        num_decodes = int(is_decode.sum())
        num_parts = 0
        if num_decodes:
            num_parts = self.split_parts(
                num_decodes,
                int(slens[is_decode].max()),
                int(qlens[~is_decode].sum()),
                device,
            )
        split = is_decode if num_parts else torch.zeros(num_reqs, dtype=torch.bool)

        in_b = ~split & (qlens > 0)
        max_qlen = int(qlens[in_b].max()) if bool(in_b.any()) else 1
        work_q = min(MAX_WORK_Q, _next_pow2(max_qlen))
        work_req, work_qoff = work_items(torch.where(in_b, qlens, 0), work_q)
        split_req = torch.nonzero(split).flatten()

        n_items = work_req.numel()
        # One copy; each part starts 16-byte aligned (4 int32s), as the kernels were
        # compiled for (an unaligned pointer would compile another variant mid-serving).
        padded = -(-n_items // 4) * 4
        packed = torch.zeros(2 * padded + split_req.numel(), dtype=torch.int32)
        packed[:n_items] = work_req
        packed[padded : padded + n_items] = work_qoff
        packed[2 * padded :] = split_req
        if device.type == "cuda":  # pinned + non-blocking: do not wait for queued work
            packed = packed.pin_memory().to(device, non_blocking=True)
        else:
            packed = packed.to(device)
        meta.backend_data = TritonPlan(
            work_req=packed[:n_items],
            work_qoff=packed[padded : padded + n_items],
            work_q=work_q,
            split_req=packed[2 * padded :],
            num_parts=num_parts if split_req.numel() else 0,
        )
        return meta

    def for_group(
        self, meta: AttentionMetadata, block_tables: torch.Tensor, slot_mapping: torch.Tensor
    ) -> AttentionMetadata:
        # The plan is work items over queries: the same for every group's blocks.
        return dataclasses.replace(meta, block_tables=block_tables, slot_mapping=slot_mapping)

    def decode_plan(self, num_reqs: int, device: torch.device, split: bool = False) -> TritonPlan:
        """A fixed plan for `num_reqs` single-token decodes (request i owns query token i):
        what a CUDA graph captures once and replays with new sequence lengths and block
        tables. `split`: every decode takes the split-KV path, at the partition count of
        `graph_split_parts(num_reqs)`."""
        rows = torch.arange(num_reqs, dtype=torch.int32, device=device)
        empty = torch.zeros(0, dtype=torch.int32, device=device)
        if split:
            parts = self.graph_split_parts(num_reqs, device)
            if not parts:
                raise ValueError(f"{num_reqs} decodes do not take the split-KV path")
            return TritonPlan(empty, empty, 1, rows, parts)
        return TritonPlan(rows, torch.zeros_like(rows), 1, empty, 0)

    def mixed_graph_plan(self, work_req: torch.Tensor, work_qoff: torch.Tensor) -> TritonPlan:
        """The plan a CUDA graph of a prefill or mixed step captures: kernel B over the
        items in `work_req` / `work_qoff` (int32 device buffers the graph owns and refills
        each step; a padding item names a request that owns no tokens), no split-KV."""
        empty = torch.zeros(0, dtype=torch.int32, device=work_req.device)
        return TritonPlan(work_req, work_qoff, self.MIXED_GRAPH_WORK_Q, empty, 0)

    def graph_split_parts(self, num_reqs: int, device: torch.device) -> int:
        """Partitions a split-KV graph of `num_reqs` decodes captures (0: none is worth
        capturing at this size)."""
        if self.split_kv is False:
            return 0
        return triton_split_kv.split_kv_parts(num_reqs, self.num_kv_heads, self._sm_count(device))

    def graph_wants_split(self, num_reqs: int, max_context: int, device: torch.device) -> bool:
        """Whether a decode step padded to `num_reqs` rows should replay the split graph."""
        return self.split_parts(num_reqs, max_context, 0, device) > 0

    # ---- once a layer -----------------------------------------------------------------

    def write_kv(
        self,
        k: torch.Tensor,
        v: torch.Tensor,
        kv_cache: torch.Tensor,
        slot_mapping: torch.Tensor,
        q: torch.Tensor | None = None,
        rotary: tuple[torch.Tensor, torch.Tensor] | None = None,
        kv_scale: tuple[float, float] = (1.0, 1.0),
        head_norm: HeadNorm | None = None,
    ) -> None:
        """Kernel A: copy each token's K/V rows into its slot (a slot < 0 is skipped). With
        `rotary` (cos, sin [T, 1, D]), q is rotated in place and k on its way to the cache,
        in the same launch; with `head_norm`, each head of both is RMS-normed first. An FP8
        cache stores k / k_scale and v / v_scale, saturated."""
        write_kv(k, v, kv_cache, slot_mapping, q, rotary, kv_scale, head_norm)

    def forward_latent(
        self,
        q: torch.Tensor,
        latent: torch.Tensor,
        kv_cache: torch.Tensor,
        meta: AttentionMetadata,
        scale: float,
        value_dim: int,
    ) -> torch.Tensor:
        """Kernel A writes the latents (into both cache halves: one tensor), then
        triton_mla's kernels attend over kernel B's plan (a latent model's backend is
        built without split-KV, whose decodes kernel B's plan leaves out)."""
        self.write_kv(latent, latent, kv_cache, meta.slot_mapping)
        sms = self._sm_count(q.device)
        return triton_mla.mla_attention(q, kv_cache[0], value_dim, meta, scale, sms)

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
        head_norm: HeadNorm | None = None,
    ) -> torch.Tensor:
        plan: TritonPlan = meta.backend_data
        num_tokens, num_heads, head_dim = q.shape
        num_kv_heads = kv_cache.shape[3]
        block_size = kv_cache.shape[2]
        if not 16 <= head_dim <= MAX_HEAD_DIM or head_dim % 2:
            raise ValueError(f"head_dim must be even, 16 to {MAX_HEAD_DIM}, got {head_dim}")
        if window is not None and window < 1:
            raise ValueError(f"a sliding window must be positive, got {window}")
        if num_heads % num_kv_heads:
            raise ValueError(f"{num_heads} query heads do not group over {num_kv_heads}")
        if kv_cache.stride(-1) != 1 or q.stride(-1) != 1 or k.stride(-1) != 1:
            raise ValueError("q, k, v and the cache need a contiguous last (head_dim) axis")
        if v.stride(-1) != 1:
            raise ValueError("q, k, v and the cache need a contiguous last (head_dim) axis")
        out = torch.empty((num_tokens, num_heads, head_dim), dtype=q.dtype, device=q.device)
        if num_tokens == 0:
            return out

        kv_scale = kv_scale if is_fp8(kv_cache.dtype) else (1.0, 1.0)
        self.write_kv(k, v, kv_cache, meta.slot_mapping, q, rotary, kv_scale, head_norm)
        use_pdl = pdl(q.device)

        group = num_heads // num_kv_heads
        g_pad = _next_pow2(group)
        # An FP8 cache holds k / k_scale and v / v_scale: k_scale folds into the scores'
        # scale, v_scale into the output, so the tiles are only widened, never multiplied.
        qk_scale = scale * LOG2E * kv_scale[0]
        v_scale = kv_scale[1]
        # The kernels cap scores in the log2 domain they keep them in (a cap of 0: none, as
        # the other backends and transformers read it).
        softcap_log2 = softcap * LOG2E if softcap else None
        window = NO_WINDOW if window is None else min(window, NO_WINDOW)
        tile_dim = _next_pow2(head_dim)
        # The products run in the model's dtype (an FP8 cache's tiles are widened to it).
        # fp32 models get true fp32 products (tf32 would break the reference tolerance).
        precision = "ieee" if q.dtype == torch.float32 else "tf32"
        # Triton's interpreter multiplies bf16 blocks as raw 16-bit integers (seen with
        # triton 3.9), so under it the products run in fp32 on the same bf16 values.
        dot_f32 = _INTERPRETER and q.dtype == torch.bfloat16
        block_tables = meta.block_tables
        n_items = plan.work_req.numel()
        if n_items:
            # Two tile shapes, so two compiled variants in all: decode-only steps take the
            # small tile alone; any other step the big tile, with the small one chosen at
            # run time by programs that own few rows (decodes in a mixed batch).
            small_m = max(16, g_pad)
            block_m = small_m if plan.work_q == 1 else max(small_m, MAX_BLOCK_M)
            tok = block_m // g_pad
            n_sub = _cdiv(plan.work_q, tok)
            block_n, num_warps, num_stages = _tile_config(q.dtype, tile_dim)
            if plan.work_q == 1:
                num_warps, num_stages = 4, 2
                if q.dtype != torch.float32:
                    block_n, num_warps, num_stages = decode_launch(n_items, tile_dim)
            paged_attention_kernel[(n_items, num_kv_heads, n_sub)](
                q,
                out,
                kv_cache,
                block_tables,
                meta.query_start_loc,
                meta.seq_lens,
                plan.work_req,
                plan.work_qoff,
                q.stride(0),
                q.stride(1),
                out.stride(0),
                out.stride(1),
                kv_cache.stride(0),
                kv_cache.stride(1),
                kv_cache.stride(2),
                kv_cache.stride(3),
                block_tables.stride(0),
                group,
                qk_scale,
                v_scale,
                plan.work_q,
                window,
                softcap_log2 or 1.0,
                sinks if sinks is not None else q,
                meta.key_limits if meta.key_limits is not None else meta.seq_lens,
                SOFTCAP=softcap_log2 is not None,
                SINKS=sinks is not None,
                LIMITS=meta.key_limits is not None,
                TOK=tok,
                BLOCK_M=block_m,
                SMALL_M=small_m,
                G_PAD=g_pad,
                BLOCK_N=block_n,
                HEAD_DIM=tile_dim,
                DIM=head_dim,
                BLOCK_SIZE=block_size,
                DOT_PRECISION=precision,
                DOT_F32=dot_f32,
                TWO_PHASE=PREFILL_TWO_PHASE,
                PDL=use_pdl,
                num_warps=num_warps,
                num_stages=num_stages,
                launch_pdl=use_pdl,
            )
        if plan.split_req.numel():
            triton_split_kv.split_kv_attention(
                q,
                out,
                kv_cache,
                block_tables,
                meta.query_start_loc,
                meta.seq_lens,
                plan.split_req,
                plan.num_parts,
                self.split_min_partition,
                qk_scale,
                precision,
                dot_f32,
                use_pdl,
                v_scale,
                window,
                softcap_log2,
                sinks,
            )
        return out
