"""Compile every Triton kernel variant that serving can reach, before the engine is ready.

A Triton kernel compiles once per variant (its constexpr values, launch settings and the
specialisation of its integer and pointer arguments), on the first launch that needs it:
hundreds of milliseconds to seconds, in the middle of someone's request if it happens
while serving. The kernels are written so that a variant depends only on the kind of step
(step-varying integers are `do_not_specialize`, pointers stay 16-byte aligned), so a few
synthetic steps reach them all:

    prefill      one request, a chunk of several work items      kernel B, prefill tile
    mixed        a prefill chunk after a cached prefix, a decode  kernel B, both tiles
                 (again with key limits for a model that attends
                 an image's tokens both ways)
    decode       1 and DECODE_LARGE_BATCH one-token requests      kernel B, decode settings;
                                                                  batch-1 fused GEMVs
    split        one decode over a context of split_min_context  kernel C and its reduce
    sampling     a greedy batch and a top-p one with logprobs     argmax in both dtypes

The steps run eagerly through the model over a scratch table of the KV pool's blocks 1..n
(block 0 stays zero, as padded reads expect; the others are free, and a request always
writes a slot before it reads it). The prefill and mixed steps run first (they compile the
kernels every step shares); on a GPU the decode and split steps, which compile different
kernels each, then run on threads at once, so their compiles overlap (ptxas runs as a
subprocess, and Triton's compiler drops the GIL in places). CUDA-graph capture then runs decode steps again; it
finds their kernels compiled. tests/worker/test_warmup.py records every variant launched
under Triton's interpreter and checks that a mixed workload after warm-up adds none.
"""

from __future__ import annotations

import logging
import time
from concurrent.futures import ThreadPoolExecutor

import torch

from cadence.attention.base import AttentionMetadata
from cadence.distributed.parallel_state import get_tp
from cadence.layers.sampler import SamplingBatch
from cadence.worker.runner_parts import RunnerParts

logger = logging.getLogger(__name__)


def warm_up_steps(
    max_num_seqs: int,
    max_tokens: int,
    max_context: int,
    split_min_context: int,
) -> list[list[tuple[int, int]]]:
    """The synthetic steps, each a list of (query tokens, context length after the step)
    per request. `max_tokens` bounds a step's tokens, `max_context` a request's length."""
    from cadence.attention.triton_paged import DECODE_LARGE_BATCH, MAX_WORK_Q

    chunk = max(1, min(max_tokens - 1, 2 * MAX_WORK_Q + 3, max_context - 1))
    steps = [
        [(chunk, chunk)],  # a prefill from position 0
        [(chunk, min(max_context, chunk + 37)), (1, min(max_context, 50))],  # mixed, cached
        [(1, min(max_context, 20))],
    ]
    if max_num_seqs >= DECODE_LARGE_BATCH and max_tokens >= DECODE_LARGE_BATCH:
        steps.append([(1, min(max_context, 30))] * DECODE_LARGE_BATCH)
    if split_min_context <= max_context:
        steps.append([(1, split_min_context)])
    return steps


def _step_meta(
    runner: RunnerParts, reqs: list[tuple[int, int]], table: torch.Tensor
) -> tuple[torch.Tensor, AttentionMetadata]:
    """(positions, metadata) of a step whose requests all read and write one scratch
    table row (they share blocks: their K/V is garbage nobody keeps)."""
    dev, bs = runner.device, runner.block_size
    positions = torch.cat([torch.arange(s - q, s) for q, s in reqs])
    slots = table[positions // bs] * bs + positions % bs
    qlens = [q for q, _ in reqs]
    qsl = torch.tensor([0, *qlens]).cumsum(0)
    meta = AttentionMetadata(
        num_tokens=len(positions),
        query_start_loc=qsl.to(dev),
        seq_lens=torch.tensor([s for _, s in reqs]).to(dev),
        slot_mapping=slots.to(dev),
        block_tables=table.expand(len(reqs), -1).contiguous().to(dev),
        query_lens_cpu=qlens,
        seq_lens_cpu=[s for _, s in reqs],
        block_size=bs,
    )
    return positions.to(dev), meta


@torch.inference_mode()
def warm_up(runner: RunnerParts) -> float:
    """Run the synthetic steps and both samplers; returns the seconds it took."""
    t0 = time.perf_counter()
    backend = runner.backend
    sc = runner.config.scheduler
    bs = runner.block_size
    # Contexts the scratch row can hold: the pool's blocks past block 0.
    max_context = min(runner.max_model_len, (runner.num_blocks - 1) * bs)
    if max_context < 2:
        return 0.0
    table = torch.arange(1, -(-max_context // bs) + 1, dtype=torch.int64)
    split_min = getattr(backend, "split_min_context", max_context + 1)
    steps = warm_up_steps(sc.max_num_seqs, sc.max_num_batched_tokens, max_context, split_min)

    def run(reqs: list[tuple[int, int]], limits: bool = False) -> torch.Tensor | None:
        with torch.inference_mode():  # (thread-local)
            positions, meta = _step_meta(runner, reqs, table)
            if limits:  # (each token's own position: the variant, not the semantics)
                meta.key_limits_cpu = positions.cpu()
                meta.key_limits = positions.to(torch.int32)
            meta = backend.build(meta)
            if reqs == [(1, split_min)] and not meta.backend_data.split_req.numel():
                # The rule did not split here (a GPU this batch fills): graphs may still.
                if not backend.graph_split_parts(1, runner.device):
                    return None
                meta.backend_data = backend.decode_plan(1, runner.device, split=True)
            ids = torch.randint(0, runner.vocab_size, (len(positions),), device=runner.device)
            return runner.model(ids, positions, meta)

    hidden = run(steps[0])
    run(steps[1])
    if runner.model.bidirectional_images:  # steps with image tokens (Gemma 3)
        run(steps[1], limits=True)
    if runner.device.type == "cuda" and get_tp().size == 1:
        # (Not with tensor parallelism: each rank must issue its collectives in one order.)
        with ThreadPoolExecutor(max_workers=len(steps) - 2) as pool:
            list(pool.map(run, steps[2:]))
    else:  # Triton's interpreter patches triton.language while it runs: one at a time
        for reqs in steps[2:]:
            run(reqs)
    rows = min(sc.max_num_seqs, 2)
    logits = runner.model.compute_logits(hidden[:1].expand(rows, -1).contiguous())
    greedy = SamplingBatch(None, None, None, None, all_greedy=True, generators={})
    runner.sampler(logits, greedy)
    top_p = SamplingBatch(
        temperature=torch.ones(rows, device=runner.device),
        top_k=None,
        top_p=torch.full((rows,), 0.9, device=runner.device),
        min_p=None,
        all_greedy=False,
        generators={},
        max_logprobs=1,
    )
    runner.sampler(logits, top_p)
    if runner.device.type == "cuda":
        torch.cuda.synchronize(runner.device)
    return time.perf_counter() - t0
