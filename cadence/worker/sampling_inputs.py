"""The per-row inputs of one step's sampling, built on the host and copied once."""

from __future__ import annotations

from typing import Protocol

import numpy as np
import torch

from cadence.layers.sampler import SamplingBatch
from cadence.sampling_params import SamplingParams
from cadence.worker.transfer import to_device, to_device_aligned


class SamplingState(Protocol):
    """What the batch needs of a request (the runner's per-request state)."""

    token_ids: list[int]  # prompt + output
    num_prompt_tokens: int
    params: SamplingParams
    generator: torch.Generator | None


def build_sampling_batch(
    states: list[SamplingState],
    dev: torch.device,
    vocab_size: int,
    eos_token_ids: tuple[int, ...],
) -> SamplingBatch:
    """One row per state, in order: temperatures and filters, logit bias and the
    min_tokens ban, penalties, and the largest number of logprobs any row wants."""
    params = [s.params for s in states]
    vocab = vocab_size
    temps = [0.0 if p.greedy else p.temperature for p in params]
    all_greedy = all(t == 0.0 for t in temps)
    batch = SamplingBatch(
        temperature=None,
        top_k=None,
        top_p=None,
        min_p=None,
        all_greedy=all_greedy,
        generators={
            i: s.generator
            for i, s in enumerate(states)
            if s.generator is not None and not s.params.greedy
        },
    )
    if not all_greedy:
        # Every per-row parameter in one [4, rows] copy (top-k as a float: exact
        # for any vocabulary below 2^24).
        rows = torch.tensor(
            [
                temps,
                [p.top_k if 0 < p.top_k < vocab else vocab for p in params],
                [p.top_p for p in params],
                [p.min_p for p in params],
            ],
            dtype=torch.float32,
        )
        temperature, top_k, top_p, min_p = to_device(rows, dev)
        batch.temperature = temperature
        if any(0 < p.top_k < vocab for p in params):
            batch.top_k = top_k.long()
        if any(p.top_p < 1.0 for p in params):
            batch.top_p = top_p
        if any(p.min_p > 0.0 for p in params):
            batch.min_p = min_p
    # Logit bias, the min_tokens ban and the penalties' token counts are [rows, vocab]
    # tensors built on the device from sparse (row * vocab + token) indices: only the
    # ids cross to the device, never a dense [rows, 128k] host tensor.
    n = len(states)
    bias_idx: list[int] = []
    bias_val: list[float] = []
    ban_idx: list[int] = []
    for i, (s, p) in enumerate(zip(states, params)):
        for tid, b in (p.logit_bias or {}).items():
            bias_idx.append(i * vocab + int(tid))
            bias_val.append(float(b))
        if len(s.token_ids) - s.num_prompt_tokens < p.min_tokens:
            banned = list(p.stop_token_ids) + ([] if p.ignore_eos else list(eos_token_ids))
            ban_idx.extend(i * vocab + t for t in banned)
    if bias_idx or ban_idx:
        bias = torch.zeros(n * vocab, dtype=torch.float32, device=dev)
        if bias_idx:
            values = to_device(torch.tensor(bias_val, dtype=torch.float32), dev)
            bias.index_add_(0, to_device(torch.tensor(bias_idx), dev), values)
        if ban_idx:  # after the bias: a ban wins over any bias
            bias.index_fill_(0, to_device(torch.tensor(ban_idx), dev), float("-inf"))
        batch.bias = bias.view(n, vocab)
    penalized = [i for i, p in enumerate(params) if p.needs_penalties]
    if penalized:
        out_idx, seen_idx = [], []
        for i in penalized:
            s = states[i]
            ids = np.asarray(s.token_ids, dtype=np.int64) + i * vocab
            out_idx.append(ids[s.num_prompt_tokens :])
            seen_idx.append(ids)  # the repetition penalty counts the prompt too
        segments = [np.concatenate(out_idx), np.concatenate(seen_idx)]
        out_d, seen_d = to_device_aligned(segments, dev)
        counts = torch.zeros(n * vocab, dtype=torch.float32, device=dev)
        counts.index_add_(0, out_d, torch.ones(len(out_d), dtype=torch.float32, device=dev))
        seen = torch.zeros(n * vocab, dtype=torch.bool, device=dev)
        seen[seen_d] = True
        factors = torch.tensor(
            [[p.presence_penalty, p.frequency_penalty, p.repetition_penalty] for p in params],
            dtype=torch.float32,
        )
        batch.presence, batch.frequency, batch.repetition = to_device(factors.T.contiguous(), dev)
        batch.output_counts = counts.view(n, vocab)
        batch.seen_mask = seen.view(n, vocab)
    wanted = [p.logprobs for p in params if p.logprobs is not None]
    batch.max_logprobs = max(wanted) if wanted else None
    return batch
