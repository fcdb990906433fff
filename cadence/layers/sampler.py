"""Batched sampling on the device, after the forward pass.

Order, per row:  raw logprobs (if asked)  ->  logit bias, min_tokens ban, penalties
                 ->  grammar mask (structured outputs)
                 ->  greedy argmax, or temperature / top-k / top-p / min-p and a draw.

Draws on a GPU use the exponential race (argmax of p / E with E ~ Exp(1)), which needs
one random number per vocabulary entry; on a CPU the inverse CDF, one uniform a row (with
the fused kernels, `cpu_ops.sample_rows` does the whole temperature draw in one call). A
request with a seed draws its numbers from its own generator, so its text does not depend
on what else shares the batch.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from cadence.ops import cpu_ops


@dataclass
class SamplingBatch:
    """Per-row sampling inputs for one step; rows are the requests that sample."""

    temperature: torch.Tensor | None  # [B] float32; 0 for greedy rows; None if all greedy
    top_k: torch.Tensor | None  # [B] int64, vocab size where unused; None if no row uses it
    top_p: torch.Tensor | None  # [B] float32
    min_p: torch.Tensor | None  # [B] float32
    all_greedy: bool
    generators: dict[int, torch.Generator]  # row -> its own generator (seeded requests)
    # Dense [B, V] additive bias: logit_bias and the min_tokens ban (-inf), or None.
    bias: torch.Tensor | None = None
    # Penalties: None if no row uses them.
    presence: torch.Tensor | None = None  # [B]
    frequency: torch.Tensor | None = None  # [B]
    repetition: torch.Tensor | None = None  # [B]
    output_counts: torch.Tensor | None = None  # [B, V] occurrences in the output so far
    seen_mask: torch.Tensor | None = None  # [B, V] in prompt or output (repetition penalty)
    max_logprobs: int | None = None  # top-N logprobs wanted by some row; None: none
    # [B, ceil(V / 32)] int32, bit (t % 32) of word t // 32 set = token t allowed; None: all.
    allowed_bitmask: torch.Tensor | None = None


@dataclass
class SamplerOutput:
    token_ids: torch.Tensor  # [B] int64
    logprobs: torch.Tensor | None = None  # [B] the sampled token's
    top_ids: torch.Tensor | None = None  # [B, N]
    top_logprobs: torch.Tensor | None = None  # [B, N]


class Sampler:
    def __call__(self, logits: torch.Tensor, batch: SamplingBatch) -> SamplerOutput:
        if (
            batch.max_logprobs is None
            and batch.bias is None
            and batch.repetition is None
            and batch.allowed_bitmask is None
        ):  # the common cases: nothing changes the logits before the choice
            return SamplerOutput(
                _argmax(logits) if batch.all_greedy else self._sample(logits, batch)
            )
        logits, raw_logprobs = self.process(logits, batch)
        if batch.all_greedy:
            tokens = _argmax(logits)
        else:
            tokens = self._sample(logits, batch)
        return with_logprobs(SamplerOutput(tokens), raw_logprobs, batch.max_logprobs)

    def process(
        self, logits: torch.Tensor, batch: SamplingBatch
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(float32 logits after bias, penalties and the grammar mask, the raw log-softmax
        if any row wants logprobs)."""
        logits = raw = logits.float()
        raw_logprobs = torch.log_softmax(logits, dim=-1) if batch.max_logprobs is not None else None

        if batch.bias is not None:
            logits = logits + batch.bias
        if batch.repetition is not None:
            logits = _apply_penalties(logits, batch)
        if batch.allowed_bitmask is not None:
            biased = logits is not raw
            logits = apply_token_bitmask(logits, batch.allowed_bitmask)  # in place
            if biased:
                # A bias or the min_tokens ban may forbid every token the grammar allows
                # (say, only EOS is left): the grammar wins, so no row is all -inf.
                dead = torch.isneginf(logits).all(dim=-1)
                if dead.any():
                    fallback = apply_token_bitmask(raw.clone(), batch.allowed_bitmask)
                    logits = torch.where(dead[:, None], fallback, logits)
        return logits, raw_logprobs

    def probs(self, logits: torch.Tensor, batch: SamplingBatch) -> torch.Tensor:
        """The distribution each row samples from: temperature, then top-k / top-p, then
        min-p (rows need not sum to 1). Greedy rows get temperature 1 (unused)."""
        temp = torch.where(batch.temperature == 0, 1.0, batch.temperature)
        logits = logits / temp[:, None]
        if batch.top_k is not None or batch.top_p is not None:
            logits = _top_k_top_p(logits, batch.top_k, batch.top_p)
        probs = logits.softmax(dim=-1)
        if batch.min_p is not None:
            cutoff = probs.max(dim=-1, keepdim=True).values * batch.min_p[:, None]
            probs = probs.masked_fill(probs < cutoff, 0.0)
        return probs

    def draw(self, probs: torch.Tensor, batch: SamplingBatch) -> torch.Tensor:
        """One token per row, distributed as the row's (unnormalised) probs. On a GPU the
        exponential race (the argmax of p / E, one E ~ Exp(1) an entry); on a CPU, where
        torch draws exponentials one at a time (14.5 ms for 16 rows of 49,152: half a
        decode step of the default model), the inverse CDF, one uniform a row."""
        if not probs.is_cuda:
            return _inverse_cdf(probs, _uniforms(probs, batch.generators))
        noise = torch.empty_like(probs).exponential_()
        for row, gen in batch.generators.items():
            noise[row].exponential_(generator=gen)
        return _argmax(probs / noise)

    def _sample(self, logits: torch.Tensor, batch: SamplingBatch) -> torch.Tensor:
        if (
            batch.top_k is None
            and batch.top_p is None
            and batch.min_p is None
            and logits.stride(-1) == 1
            and (ops := cpu_ops.usable(logits)) is not None
        ):
            # Temperature only (what a client that sets nothing gets): the argmax of greedy
            # rows and the other rows' softmax and draw, in one pass over the logits.
            tokens = torch.empty(logits.shape[0], dtype=torch.int64)
            temperature = batch.temperature.float().contiguous()
            ops.sample_rows(tokens, logits, temperature, _uniforms(logits, batch.generators))
            return tokens
        logits = logits.float()
        greedy_tokens = _argmax(logits)
        sampled = self.draw(self.probs(logits, batch), batch)
        return torch.where(batch.temperature == 0, greedy_tokens, sampled)


def _uniforms(rows: torch.Tensor, generators: dict[int, torch.Generator]) -> torch.Tensor:
    """One float64 uniform in [0, 1) per row of `rows`, from the row's own generator where
    it has one."""
    uniform = torch.rand(rows.shape[0], dtype=torch.float64, device=rows.device)
    for row, gen in generators.items():
        uniform[row] = torch.rand(1, generator=gen, dtype=torch.float64, device=rows.device)
    return uniform


def _inverse_cdf(probs: torch.Tensor, uniform: torch.Tensor) -> torch.Tensor:
    """Row i's token: the first whose running sum of probs exceeds uniform[i] times the
    row's total. Sums in float64; a token of zero mass is never the first to exceed (its
    sum equals the one before it), and the target stays under the total, so the index
    stays in the row. The fused kernel where there is one (the same rule, one pass)."""
    if probs.dtype == torch.float32 and (ops := cpu_ops.usable(probs)) is not None:
        tokens = torch.empty(probs.shape[0], dtype=torch.int64)
        ops.draw_rows(tokens, probs.contiguous(), uniform)
        return tokens
    cdf = probs.double().cumsum(dim=-1)
    total = cdf[:, -1:]
    target = torch.minimum(
        uniform[:, None] * total, torch.nextafter(total, torch.zeros_like(total))
    )
    index = torch.searchsorted(cdf, target, right=True).squeeze(1)
    return index.clamp_(max=probs.shape[1] - 1)  # (an all-zero row: its last token)


def with_logprobs(
    out: SamplerOutput, raw_logprobs: torch.Tensor | None, max_logprobs: int | None
) -> SamplerOutput:
    """`out` with its tokens' raw logprobs and the top `max_logprobs` of each row."""
    if raw_logprobs is not None:
        out.logprobs = raw_logprobs.gather(1, out.token_ids[:, None]).squeeze(1)
        if max_logprobs > 0:
            out.top_logprobs, out.top_ids = raw_logprobs.topk(max_logprobs, dim=-1)
    return out


def _argmax(x: torch.Tensor) -> torch.Tensor:
    """The first index of each row's maximum; on CUDA a two-stage Triton kernel, since
    torch's one-block-per-row reduction takes ~35 us on a single 128k-entry row."""
    if x.is_cuda:
        from cadence.ops.fused import argmax_rows

        return argmax_rows(x)
    if x.dtype in (torch.bfloat16, torch.float16):
        # CPU argmax has no vectorized 16-bit path: 1.36 ms on 16 rows of 49k bf16 logits,
        # where max (same first-index rule for ties) takes 0.25 ms.
        return x.max(dim=-1).indices
    return x.argmax(dim=-1)


# Row b of this table: 0.0 where bit k of the byte b is set, -inf where clear ([256, 8]).
_BYTE_PENALTIES: dict[tuple[torch.device, torch.dtype], torch.Tensor] = {}
_PENALTY_BUFFERS: dict[tuple[torch.device, torch.dtype], torch.Tensor] = {}


def apply_token_bitmask(logits: torch.Tensor, bitmask: torch.Tensor) -> torch.Tensor:
    """In place: -inf where a row's bit is clear (bit t % 32 of word t // 32 is token t).

    Each byte of the mask picks a row of 8 penalties from a 256-row table (index_select
    into a reused buffer), and the penalties are added: one gather and one add, on any
    device. On a CPU this is ~10x faster than unpacking bits with shifts and masked_fill;
    reusing the buffer and adding in place avoid page-faulting fresh [B, V] tensors."""
    key = (logits.device, logits.dtype)
    table = _BYTE_PENALTIES.get(key)
    if table is None:
        bits = (torch.arange(256)[:, None] >> torch.arange(8)) & 1
        table = torch.where(bits.bool(), 0.0, float("-inf")).to(logits.device, logits.dtype)
        _BYTE_PENALTIES[key] = table
    rows, vocab = logits.shape
    # Little-endian bytes: byte k of a word holds its bits 8k .. 8k+7.
    byte_ids = bitmask.contiguous().view(torch.uint8).view(-1).int()
    buf = _PENALTY_BUFFERS.get(key)
    # (An inference-mode tensor cannot be written outside inference mode, and tests call
    # this outside it.)
    if (
        buf is None
        or buf.shape[0] < byte_ids.numel()
        or buf.is_inference() != torch.is_inference_mode_enabled()
    ):
        buf = _PENALTY_BUFFERS[key] = torch.empty(
            (byte_ids.numel(), 8), dtype=logits.dtype, device=logits.device
        )
    penalties = buf[: byte_ids.numel()]
    torch.index_select(table, 0, byte_ids, out=penalties)
    return logits.add_(penalties.view(rows, -1)[:, :vocab])


def _top_k_top_p(
    logits: torch.Tensor, top_k: torch.Tensor | None, top_p: torch.Tensor | None
) -> torch.Tensor:
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    vocab = logits.shape[-1]
    if top_k is not None:
        ranks = torch.arange(vocab, device=logits.device)[None, :]
        sorted_logits = sorted_logits.masked_fill(ranks >= top_k[:, None], float("-inf"))
    if top_p is not None:
        probs = sorted_logits.softmax(dim=-1)
        before = probs.cumsum(dim=-1) - probs  # mass strictly above each token
        drop = before > top_p[:, None]
        drop[:, 0] = False  # always keep the best token
        sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
    return torch.empty_like(logits).scatter_(1, order, sorted_logits)


def _apply_penalties(logits: torch.Tensor, batch: SamplingBatch) -> torch.Tensor:
    # Repetition (CTRL-style, over prompt and output): shrink positive logits, grow negative.
    rep = batch.repetition[:, None]
    penalized = torch.where(logits > 0, logits / rep, logits * rep)
    logits = torch.where(batch.seen_mask, penalized, logits)
    # OpenAI-style, over the output only.
    counts = batch.output_counts
    logits = logits - batch.frequency[:, None] * counts
    logits = logits - batch.presence[:, None] * (counts > 0).to(logits.dtype)
    return logits
