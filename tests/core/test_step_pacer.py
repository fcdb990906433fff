"""The step pacer (cadence/core/step_pacer.py): from the steps' own durations it caps the
prompt tokens a step carries beside decodes so the step takes at most `factor` decode-only
steps; the scheduler takes the lower of its cap and the static bound."""

from __future__ import annotations

import pytest
from scheduler_helpers import add_all, make_request, make_scheduler, step

from cadence.core.step_pacer import MIN_TOKENS, StepPacer

MS = 1e-3


def run_steps(pacer: StepPacer, steps, start: float = 100.0) -> float:
    """Synchronous steps back to back: (prompt tokens, decodes, seconds) each."""
    t = start
    for prompt_tokens, decodes, seconds in steps:
        pacer.launched(t)
        t += seconds
        pacer.resolved(prompt_tokens, decodes, t)
    return t


def test_the_cap_keeps_a_mixed_step_within_factor_decode_steps():
    pacer = StepPacer(2.5)
    assert pacer.cap() is None  # nothing measured: the static bound applies
    t = run_steps(pacer, [(0, 256, 10 * MS)] * 5)
    assert pacer.cap() is None  # no mixed step yet: no price of a prompt token
    # 1,000 prompt tokens beside the decodes add 19 ms: 19 us a token
    t = run_steps(pacer, [(1000, 256, 29 * MS)], start=t)
    assert pacer.cap() == round(1.5 * 10 / 0.019)  # (2.5 - 1) x 10 ms / 19 us: 789
    # mixed steps of the cap's size keep costing 19 us a token: the cap stays
    run_steps(pacer, [(789, 256, (10 + 789 * 0.019) * MS)] * 20, start=t)
    assert pacer.cap() == pytest.approx(789, abs=2)


def test_the_cap_follows_the_decode_steps_and_the_token_price():
    pacer = StepPacer(3.0)
    t = run_steps(pacer, [(0, 64, 4 * MS)] * 50 + [(500, 64, 9 * MS)] * 50)  # 10 us a token
    assert pacer.cap() == pytest.approx(2 * 4 / 0.010, rel=0.02)  # 800
    # a bigger batch: decode steps of 8 ms, prompt tokens twice as dear
    run_steps(pacer, [(0, 256, 8 * MS)] * 80 + [(400, 256, 16 * MS)] * 80, start=t)
    assert pacer.cap() == pytest.approx(2 * 8 / 0.020, rel=0.05)  # 800 again


def test_while_every_step_is_mixed_the_decode_step_still_follows_the_batch():
    """Under steady arrivals no step is decode-only: as the batch grows, the decodes' share
    of a mixed step must show in d (the fit's intercept), not as a dearer prompt token."""
    pacer = StepPacer(2.0)
    t = run_steps(pacer, [(0, 32, 5 * MS), (300, 32, 8 * MS)] * 10)  # d 5 ms, c 10 us
    assert pacer.cap() == pytest.approx(5 / 0.010, abs=1)  # 500
    # then every step carries 500 prompt tokens while the decodes alone grow to 10 ms
    grow = [(500, 32 + i, (5 + 5 * i / 299 + 500 * 0.010) * MS) for i in range(300)]
    run_steps(pacer, grow, start=t)
    # (a moving fit lags a moving batch: within 10 % of 10 ms and of 10 us a token, where
    # pricing mixed steps against the last decode-only steps' 5 ms took 20 us a token)
    assert pacer.decode_s == pytest.approx(10 * MS, rel=0.1)
    assert pacer.per_token_s == pytest.approx(0.010 * MS, rel=0.1)
    assert 800 <= pacer.cap() <= 1000


def test_steps_without_decodes_and_idle_time_are_not_counted():
    pacer = StepPacer(2.0)
    t = run_steps(pacer, [(0, 8, 5 * MS)] * 3)
    # a prefill alone (nobody waits on it), then an idle minute before the next launch
    t = run_steps(pacer, [(4000, 0, 80 * MS)], start=t)
    run_steps(pacer, [(0, 8, 5 * MS), (400, 8, 9 * MS)], start=t + 60.0)
    assert pacer.decode_s == pytest.approx(5 * MS)
    assert pacer.cap() == pytest.approx(5 / 0.01, abs=1)  # (2 - 1) x 5 ms / 10 us: 500


def test_async_steps_are_timed_from_the_end_of_the_step_before():
    """With async scheduling step N + 1 is launched before step N's tokens are read back:
    its time runs from N's end, not from its own (early) launch."""
    pacer = StepPacer(2.0)
    pacer.launched(0.0)  # step 1
    pacer.launched(0.001)  # step 2, queued behind it
    pacer.resolved(0, 32, 0.010)  # step 1: 10 ms
    pacer.launched(0.011)  # step 3
    pacer.resolved(0, 32, 0.020)  # step 2: 10 ms (not 19)
    pacer.launched(0.021)
    pacer.resolved(200, 32, 0.034)  # step 3: 14 ms, 4 past a decode step
    assert pacer.decode_s == pytest.approx(0.010)
    assert pacer.cap() == pytest.approx(0.010 / (0.004 / 200), abs=1)  # 500


def test_the_cap_has_a_floor_and_the_factor_a_range():
    pacer = StepPacer(1.1)
    run_steps(pacer, [(0, 4, 1 * MS), (400, 4, 4001 * MS)])  # 10 ms a prompt token
    assert pacer.cap() == MIN_TOKENS
    for bad in (1.0, 0.5, -2.0):
        with pytest.raises(ValueError, match="mixed_step_factor"):
            StepPacer(bad)


def test_a_fixed_cost_of_mixing_is_met_where_the_steps_settle():
    """A mixed step costs d + F + c * P; pricing by the ratio of averages settles where
    the mixed step takes factor x d all the same (F is paid back by fewer tokens)."""
    pacer = StepPacer(2.5)
    d, fixed, per_token = 10 * MS, 3 * MS, 0.019 * MS
    t = run_steps(pacer, [(0, 256, d)] * 10 + [(1000, 256, d + fixed + 1000 * per_token)])
    for _ in range(200):  # each mixed step as large as the cap allows
        cap = pacer.cap()
        t = run_steps(pacer, [(cap, 256, d + fixed + cap * per_token), (0, 256, d)], start=t)
    assert pacer.cap() == pytest.approx((1.5 * d - fixed) / per_token, rel=0.01)  # 632


def test_what_the_fit_cannot_say_changes_nothing():
    """A few tokens' spread (jitter, graph buckets) fits no slope; a fit whose intercept is
    no positive time keeps the last cap."""
    pacer = StepPacer(2.0)
    t = run_steps(pacer, [(0, 8, 5 * MS), (20, 8, 5.5 * MS)] * 10)  # 20 tokens apart
    assert pacer.per_token_s is None and pacer.cap() is None
    t = run_steps(pacer, [(0, 8, 5 * MS), (400, 8, 9 * MS)] * 10, start=t)  # 10 us a token
    cap = pacer.cap()
    assert cap == pytest.approx(500, rel=0.05)  # (the 20-token steps still weigh a little)
    run_steps(pacer, [(800, 8, 1 * MS)] * 100, start=t)  # (a slope the batch cannot pay)
    assert pacer.decode_s <= 0 and pacer.cap() == cap


def test_a_failed_step_leaves_no_launch_behind():
    pacer = StepPacer(2.0)
    pacer.launched(0.0)  # the step that failed
    pacer.forget_launches()
    run_steps(pacer, [(0, 4, 5 * MS)], start=50.0)
    assert pacer.decode_s == pytest.approx(5 * MS)


def test_the_scheduler_takes_the_lower_of_the_pacers_cap_and_the_static_bound():
    sched = make_scheduler(num_blocks=512, budget=1024, prefill_cap=300)
    sched.pacer = StepPacer(2.0)
    sched.add_request(make_request("a", list(range(1, 5)), 20))
    step(sched)  # a's prompt: nobody decodes yet, the whole budget
    t = run_steps(sched.pacer, [(0, 1, 10 * MS), (300, 1, 16 * MS)])  # 10 ms / 20 us: 500
    assert sched.pacer.cap() == 500
    add_all(sched, [make_request("b", list(range(1000, 2200)), 4)])
    out, _ = step(sched)
    assert out.num_scheduled_tokens == {"a": 1, "b": 300}  # the static bound is lower
    sched.config.max_prefill_tokens_while_decoding = 0  # no static bound: the pacer's alone
    out, _ = step(sched)
    assert out.num_scheduled_tokens == {"a": 1, "b": 500}
    run_steps(sched.pacer, [(0, 1, 10 * MS), (400, 1, 50 * MS)] * 30, start=t)  # the floor
    assert sched.pacer.cap() == MIN_TOKENS
    out, _ = step(sched)
    assert out.num_scheduled_tokens == {"a": 1, "b": MIN_TOKENS}
