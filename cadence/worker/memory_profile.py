"""How many blocks the KV pool holds: on a GPU, what is left after running the largest step;
on the CPU, a fixed budget sized down for small models."""

from __future__ import annotations

import logging
import time

import torch

from cadence.attention.base import AttentionMetadata
from cadence.distributed.communication import min_over_ranks
from cadence.layers.sampler import SamplingBatch
from cadence.worker.mixed_graphs import captures_mixed_steps, largest_bucket, mixed_step_tokens
from cadence.worker.runner_parts import RunnerParts

logger = logging.getLogger(__name__)

# The default pool holds this many tokens (a KV group's each): 32 requests of 1,024
# tokens, or four of 8,192, and never less than one request of max_model_len. Counted in
# tokens, not bytes: a fixed 2 GiB held 93k tokens for SmolLM2-135M (2.9 GiB resident for
# a 101 MiB model), while a larger model needs its bytes for the same contexts.
DEFAULT_CPU_KV_TOKENS = 32768
# The default pool takes at most this share of the memory available at start-up.
DEFAULT_CPU_KV_SHARE = 0.25


def num_kv_blocks(runner: RunnerParts, per_block: int) -> int:
    """The pool's blocks, at `per_block` bytes each (every KV slot's, a drafter's too)."""
    cc = runner.config.cache
    if cc.num_gpu_blocks_override is not None:
        return cc.num_gpu_blocks_override
    if runner.device.type == "cuda":
        budget = profile_cuda_memory(runner)
    else:
        budget = cc.kv_cache_memory or _default_cpu_kv_bytes(runner, per_block)
    # Every rank must hold the same blocks: the smallest pool any of them can.
    n = min_over_ranks(int(budget // per_block))
    if n < 1:
        raise ValueError(
            f"no room for KV blocks: {budget / 2**30:.2f} GiB left, {per_block} bytes a block"
        )
    return n


def _default_cpu_kv_bytes(runner: RunnerParts, per_block: int) -> int:
    """DEFAULT_CPU_KV_TOKENS (or one max_model_len sequence, if more), or less: at most
    twice what the scheduler can fill at once (max_num_seqs sequences of max_model_len,
    a block list per KV group; the other half keeps finished prompts for the prefix
    cache), and at most DEFAULT_CPU_KV_SHARE of the memory available now. A pool past that
    only costs RAM (it is resident from the first second: kv_tensors faults it in);
    `--kv-cache-memory` asks for more. The choice is logged."""
    groups = runner.kv_groups.num_groups
    per_seq = runner.max_blocks_per_seq * groups
    default = max(-(-DEFAULT_CPU_KV_TOKENS // runner.block_size) * groups, per_seq + 1)
    most = 2 * runner.config.scheduler.max_num_seqs * per_seq + 1
    limits = {
        f"the default, {DEFAULT_CPU_KV_TOKENS} tokens or one max_model_len": default * per_block,
        "twice max_num_seqs x max_model_len": most * per_block,
    }
    if (available := _available_memory()) is not None:
        limits[f"{DEFAULT_CPU_KV_SHARE:.0%} of the available memory"] = int(
            available * DEFAULT_CPU_KV_SHARE
        )
    reason, budget = min(limits.items(), key=lambda item: item[1])
    logger.info("CPU KV pool: %.0f MiB (%s; --kv-cache-memory sets it)", budget / 2**20, reason)
    return budget


def _available_memory() -> int | None:
    """MemAvailable in bytes (Linux), or None where /proc/meminfo does not say."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


@torch.inference_mode()
def profile_cuda_memory(runner: RunnerParts) -> int:
    """Bytes the KV pool may take: total x gpu_memory_utilization, minus what is in use
    (weights, CUDA context, other processes) and the peak of a profiling step.

    The profiling step is the largest one the scheduler can make: max_num_batched_tokens
    prompt tokens (in as many requests as max_model_len needs), then logits and a
    top-p sample with logprobs for max_num_seqs rows, over a temporary KV cache. Prompt
    logprobs (`prompt_logprobs.compute`) take at most as many rows at a time, and less
    memory per row than that sample, so the measured peak covers them too."""
    dev = runner.device
    sc = runner.config.scheduler
    torch.cuda.synchronize(dev)
    torch.cuda.empty_cache()
    free_before, total = torch.cuda.mem_get_info(dev)
    used_before = total - free_before
    allocated_before = torch.cuda.memory_allocated(dev)
    torch.cuda.reset_peak_memory_stats(dev)

    num_tokens = sc.max_num_batched_tokens
    lens = [
        min(runner.max_model_len, num_tokens - i)
        for i in range(0, num_tokens, runner.max_model_len)
    ]
    bs = runner.block_size
    tables = []
    next_block = 1  # block 0 stays the zero block
    for n in lens:
        count = -(-n // bs)
        tables.append(list(range(next_block, next_block + count)))
        next_block += count
    runner.num_blocks = next_block
    runner.allocate_kv_cache(log=False)
    t0 = time.perf_counter()
    width = max(len(t) for t in tables)
    table_t = torch.zeros((len(tables), width), dtype=torch.int64)
    for i, t in enumerate(tables):
        table_t[i, : len(t)] = torch.tensor(t)
    positions = torch.cat([torch.arange(n) for n in lens])
    slots = torch.cat(
        [
            torch.tensor(t)[torch.arange(n) // bs] * bs + torch.arange(n) % bs
            for t, n in zip(tables, lens)
        ]
    )
    qsl = torch.tensor([0, *lens]).cumsum(0)
    meta = AttentionMetadata(
        num_tokens=num_tokens,
        query_start_loc=qsl.to(dev),
        seq_lens=torch.tensor(lens).to(dev),
        slot_mapping=slots.to(dev),
        block_tables=table_t.to(dev),
        query_lens_cpu=list(lens),
        seq_lens_cpu=list(lens),
        block_size=bs,
    )
    meta = runner.backend.build(meta)
    ids = torch.randint(0, runner.vocab_size, (num_tokens,), device=dev)
    hidden = runner.model(ids, positions.to(dev), meta)
    rows = min(sc.max_num_seqs, num_tokens)
    logits = runner.model.compute_logits(hidden[:rows])
    batch = SamplingBatch(
        temperature=torch.ones(rows, device=dev),
        top_k=None,
        top_p=torch.full((rows,), 0.9, device=dev),
        min_p=None,
        all_greedy=False,
        generators={},
        max_logprobs=20,
    )
    runner.sampler(logits, batch)
    torch.cuda.synchronize(dev)
    peak = torch.cuda.max_memory_allocated(dev) - allocated_before
    kv_temp = sum(c.numel() * c.element_size() for c in runner.kv_caches)
    activations = peak - kv_temp
    del hidden, logits, meta
    draft_layers = runner.drafter.attention_layers() if runner.drafter is not None else []
    for layer in [*runner.model.attention_layers(), *draft_layers]:
        layer.kv_cache = None
    runner.kv_caches = []
    torch.cuda.empty_cache()
    # CUDA graphs of decode steps take a small pool of their own (<= max_num_seqs
    # tokens of activations); keep room for it and for allocator fragmentation.
    reserve = 512 * 2**20
    # Each KV group past the first keeps a device block table, and a table buffer in the
    # decode and the mixed-step graphs: int64 rows of max_blocks_per_seq, allocated later.
    table_rows = sc.max_num_seqs + 2
    reserve += (runner.kv_groups.num_groups - 1) * 3 * table_rows * runner.max_blocks_per_seq * 8
    # The prefill/mixed-step graphs' pool holds the largest bucket's activations: the
    # measured step's, scaled to that many tokens.
    config = runner.config
    drafting = runner.drafter is not None
    if captures_mixed_steps(config, runner.backend.capabilities, drafting):
        graph_tokens = mixed_step_tokens(sc, drafting)
        reserve += activations * largest_bucket(graph_tokens) // num_tokens
    budget = int(
        total * runner.config.cache.gpu_memory_utilization - used_before - activations - reserve
    )
    logger.info(
        "memory profile (%.1f s): %.2f GiB total, %.2f GiB in use before the KV pool "
        "(weights and CUDA context), %.2f GiB peak activations of a %d-token step, "
        "%.2f GiB reserved for CUDA graphs -> %.2f GiB for KV blocks "
        "(gpu_memory_utilization %.2f)",
        time.perf_counter() - t0,
        total / 2**30,
        used_before / 2**30,
        activations / 2**30,
        num_tokens,
        reserve / 2**30,
        budget / 2**30,
        runner.config.cache.gpu_memory_utilization,
    )
    return budget
