"""The CPU sampling kernels (`sample_rows`, `draw_rows`): greedy rows are torch's argmax,
drawn rows are the inverse CDF of the temperature softmax computed in float64, banned
tokens are never drawn, and the draws follow the distribution."""

from __future__ import annotations

import pytest
import torch

from cadence.layers import sampler as sampler_module
from cadence.layers.sampler import Sampler, SamplingBatch
from cadence.ops import cpu_ops

pytestmark = pytest.mark.skipif(
    cpu_ops.ops() is None, reason="the CPU kernels did not build (no C++ compiler here)"
)


def sample_rows(logits, temperature, uniform) -> torch.Tensor:
    out = torch.empty(logits.shape[0], dtype=torch.int64)
    cpu_ops.ops().sample_rows(out, logits, temperature.float(), uniform.double())
    return out


def temperature_batch(temperature: torch.Tensor) -> SamplingBatch:
    """Rows shaped by their temperature alone (0: greedy), no seeds."""
    return SamplingBatch(
        temperature=temperature,
        top_k=None,
        top_p=None,
        min_p=None,
        all_greedy=False,
        generators={},
    )


def reference_draw(weights: torch.Tensor, u: float) -> int:
    """The first index whose float64 running sum exceeds u times the total."""
    cdf = weights.double().cumsum(0)
    return int(torch.searchsorted(cdf, u * cdf[-1], right=True))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("vocab", [1, 7, 16, 49, 1000])
def test_greedy_rows_are_the_first_index_of_the_maximum(dtype, vocab):
    g = torch.Generator().manual_seed(vocab)
    logits = torch.randn(6, vocab, generator=g).to(dtype)
    if vocab > 3:
        logits[1, vocab - 1] = logits[1, 2] = 40.0  # a tie across lanes: the first wins
        logits[2, :] = 3.0  # all equal: index 0
    logits[3, :] = float("-inf")  # nothing allowed: index 0, as torch's argmax
    got = sample_rows(logits, torch.zeros(6), torch.rand(6, generator=g, dtype=torch.float64))
    assert got.tolist() == logits.float().argmax(-1).tolist()


def test_a_nan_is_the_maximum_as_in_torch():
    logits = torch.randn(3, 100)
    logits[0, 20] = float("nan")
    logits[1, 5] = logits[1, 70] = float("nan")  # the first NaN
    got = sample_rows(logits, torch.zeros(3), torch.rand(3, dtype=torch.float64))
    assert got.tolist() == logits.argmax(-1).tolist() == [20, 5, got[2].item()]


def test_logits_strided_in_their_last_dimension_take_the_torch_path():
    logits = torch.randn(40, 3).t()  # [3, 40], stride (1, 3): not the kernel's layout
    batch = temperature_batch(torch.tensor([0.0, 1.0, 1.0]))
    tokens = Sampler()(logits, batch).token_ids
    assert tokens[0] == logits[0].argmax() and ((tokens >= 0) & (tokens < 40)).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("temperature", [0.3, 1.0, 2.5])
def test_drawn_rows_are_the_inverse_cdf_of_the_temperature_softmax(dtype, temperature):
    g = torch.Generator().manual_seed(7)
    rows, vocab = 64, 3000  # several 512-token blocks and a cut one
    logits = (torch.randn(rows, vocab, generator=g) * 3).to(dtype)
    uniform = torch.rand(rows, generator=g, dtype=torch.float64)
    got = sample_rows(logits, torch.full((rows,), temperature), uniform)
    for r in range(rows):
        weights = torch.softmax(logits[r].double() / temperature, 0)
        want = reference_draw(weights, uniform[r].item())
        if got[r] != want:  # only where u falls within float rounding of a boundary
            cdf = weights.cumsum(0)
            edge = cdf[min(int(got[r]), int(want))].item()
            assert abs(edge - uniform[r].item()) < 1e-5, (r, int(got[r]), want)


def test_banned_tokens_are_never_drawn_at_any_temperature():
    vocab = 1200
    logits = torch.zeros(4000, vocab)
    logits[:, ::3] = float("-inf")  # a grammar's mask, or a bias that bans
    logits[:, 0] = 20.0  # the best token allowed ...
    logits[1000:, 0] = float("-inf")  # ... and, in most rows, banned too
    temperature = torch.tensor([0.01, 1.0, 5.0, 100.0]).repeat(1000)
    got = sample_rows(logits, temperature, torch.rand(4000, dtype=torch.float64))
    assert ((got[:1000] == 0) | (got[:1000] % 3 != 0)).all()
    assert (got[1000:] % 3 != 0).all()
    # u at its extremes stays inside the row and on an allowed token
    edges = sample_rows(logits[1000:1002], torch.ones(2), torch.tensor([0.0, 1.0 - 2**-53]))
    assert (edges % 3 != 0).all() and (edges < vocab).all()


def test_draws_follow_the_distribution():
    rows = 40_000
    probs = torch.tensor([0.1, 0.0, 0.6, 0.3])
    logits = probs.log().repeat(rows, 1)
    got = sample_rows(logits, torch.ones(rows), torch.rand(rows, dtype=torch.float64))
    counts = torch.bincount(got, minlength=4).double() / rows
    assert counts[1] == 0
    assert ((counts - probs.double()).abs() <= 4 * (probs * (1 - probs) / rows).sqrt()).all()


def test_draw_rows_equals_the_float64_inverse_cdf():
    g = torch.Generator().manual_seed(3)
    probs = torch.rand(32, 5000, generator=g)
    probs[probs < 0.7] = 0.0  # as top-k / top-p / min-p leave rows: unnormalised, holes
    uniform = torch.rand(32, generator=g, dtype=torch.float64)
    out = torch.empty(32, dtype=torch.int64)
    cpu_ops.ops().draw_rows(out, probs, uniform)
    want = [reference_draw(probs[r], uniform[r].item()) for r in range(32)]
    assert out.tolist() == want


def test_the_sampler_gives_the_same_draws_with_and_without_the_kernel(monkeypatch):
    """Mixed greedy and temperature rows: the kernel's path equals the unfused PyTorch one
    given the same uniforms (the torch path's float32 softmax against the kernel's exp; a
    draw on a boundary could differ, none here)."""
    g = torch.Generator().manual_seed(11)
    rows, vocab = 24, 2048
    logits = torch.randn(rows, vocab, generator=g).bfloat16() * 4
    batch = temperature_batch(torch.tensor([0.0, 0.7, 1.0] * 8))
    torch.manual_seed(5)
    fused = Sampler()(logits, batch).token_ids
    monkeypatch.setattr(sampler_module.cpu_ops, "usable", lambda x: None)
    torch.manual_seed(5)
    plain = Sampler()(logits, batch).token_ids
    assert fused.tolist() == plain.tolist()
