"""The step timeline: a ring of the last N steps, each with its phase times and its batch
composition, and the numbers add up to what the requests needed."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from model_helpers import make_prompts

from cadence import LLM, SamplingParams
from cadence.engine import step_timeline as tl
from cadence.engine.step_timeline import FIELDS, PHASES, StepTimeline

NEW_TOKENS = 6


def sched(tokens: int, seqs: int = 1, decode_seqs: int = 0, preempted: int = 0):
    """A stand-in SchedulerOutput with what the timeline reads."""
    return SimpleNamespace(
        is_empty=tokens == 0,
        total_num_scheduled_tokens=tokens,
        num_scheduled_tokens={f"r{i}": 1 for i in range(seqs)},
        num_decode_seqs=decode_seqs,
        num_decode_tokens=decode_seqs,
        preempted_ids=[f"p{i}" for i in range(preempted)],
    )


def test_laps_accumulate_per_phase_in_milliseconds():
    timeline = StepTimeline(4)
    timeline.begin()
    t0 = timeline._last
    timeline.lap(tl.SCHEDULE, t0 + 0.001)
    timeline.lap(tl.PREPARE, t0 + 0.003)
    timeline.lap(tl.FORWARD, t0 + 0.013)
    timeline.lap(tl.SAMPLE, t0 + 0.014)
    timeline.lap(tl.OUTPUT, t0 + 0.015)
    timeline.lap(tl.SAMPLE, t0 + 0.017)  # async scheduling: sampling comes back after output
    timeline.commit(sched(5, seqs=3, decode_seqs=2, preempted=1))
    timeline.add_output_time(0.0005)
    (step,) = timeline.snapshot()
    assert list(step) == list(FIELDS)
    assert [step[f"{p}_ms"] for p in PHASES] == pytest.approx([1, 2, 10, 3, 1.5])
    assert (step["num_seqs"], step["num_tokens"], step["prefill_tokens"]) == (3, 5, 3)
    assert (step["decode_seqs"], step["preempted"], step["id"]) == (2, 1, 1)


def test_the_ring_keeps_the_newest_and_answers_since_and_limit():
    timeline = StepTimeline(3)
    for _ in range(5):
        timeline.begin()
        timeline.commit(sched(1))
    timeline.begin()
    timeline.commit(sched(0))  # ran nothing: not a step
    assert timeline.num_steps == 5
    assert [s["id"] for s in timeline.snapshot()] == [3, 4, 5]
    assert [s["id"] for s in timeline.snapshot(since=3)] == [4, 5]
    assert [s["id"] for s in timeline.snapshot(limit=1)] == [5]
    assert timeline.snapshot(limit=0) == []


def test_size_zero_records_nothing_but_still_counts_steps():
    timeline = StepTimeline(0)
    timeline.begin()
    timeline.lap(tl.SCHEDULE)
    timeline.commit(sched(2))
    timeline.add_output_time(1.0)
    assert timeline.num_steps == 1 and timeline.snapshot() == []
    with pytest.raises(ValueError):
        StepTimeline(-1)


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
def test_an_engine_timeline_accounts_for_every_token(tiny_model_dir, async_scheduling):
    """Prefill tokens add up to the prompts (minus cache hits), decode sequences to the
    tokens generated after each first one, and no step exceeds the budget."""
    budget = 16
    prompts = make_prompts(512, [5, 21, 40, 9], seed=3)
    prompts.append(prompts[2][:33] + [7, 8, 9])  # shares two blocks with prompt 2
    llm = LLM(
        tiny_model_dir("llama"),
        dtype="float32",
        max_num_batched_tokens=budget,
        num_gpu_blocks_override=64,
        async_scheduling=async_scheduling,
        check_kv_integrity=True,
    )
    params = SamplingParams(temperature=0, max_tokens=NEW_TOKENS, ignore_eos=True)
    outs = []
    for p in prompts:  # one at a time, so the last one finds the cached prefix
        outs += llm.generate([{"prompt_token_ids": p}], params, use_tqdm=False)
    steps = llm.engine.timeline.snapshot()
    cached = sum(o.num_cached_tokens for o in outs)
    assert cached == 32
    assert sum(s["prefill_tokens"] for s in steps) == sum(map(len, prompts)) - cached
    assert sum(s["decode_seqs"] for s in steps) == len(prompts) * (NEW_TOKENS - 1)
    assert [s["id"] for s in steps] == list(range(1, len(steps) + 1))
    assert all(0 < s["num_tokens"] <= budget for s in steps)
    assert all(s[f"{p}_ms"] >= 0 for s in steps for p in PHASES)
    assert all(s["forward_ms"] > 0 for s in steps)
    assert not any(s["prefill_tokens"] and s["decode_seqs"] for s in steps)  # one at a time


def test_mixed_steps_show_prefill_and_decode_together(tiny_model_dir):
    llm = LLM(
        tiny_model_dir("llama"), dtype="float32", max_num_batched_tokens=8, check_kv_integrity=True
    )
    prompts = make_prompts(512, [4, 30], seed=4)
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    steps = llm.engine.timeline.snapshot()
    assert any(s["prefill_tokens"] and s["decode_seqs"] for s in steps)
    assert all(s["num_tokens"] == s["prefill_tokens"] + s["decode_seqs"] for s in steps)
