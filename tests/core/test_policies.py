"""Scheduling policies: cache-aware ordering, aging (no starvation), priority preemption."""

from __future__ import annotations

from test_scheduler import expected_output, make_request, make_scheduler, step

from cadence.core.request import RequestStatus

BS = 4


def test_lpm_admits_the_longest_cached_prefix_first():
    sched = make_scheduler(
        num_blocks=64, budget=64, max_num_seqs=1, prefix_cache="radix", policy="lpm"
    )
    warm = make_request("warm", [7] * 16 + [1], 1)
    sched.add_request(warm)
    while sched.has_unfinished_requests():
        step(sched)
    cold = make_request("cold", [9] * 17, 1, arrival_time=1.0)
    hot = make_request("hot", [7] * 16 + [2], 1, arrival_time=2.0)
    sched.add_request(cold)
    sched.add_request(hot)
    out = sched.schedule()
    assert list(out.num_scheduled_tokens) == ["hot"]  # later arrival, but 16 cached tokens


def test_dfs_weight_groups_requests_that_share_a_prefix():
    sched = make_scheduler(num_blocks=64, budget=8, max_num_seqs=8, policy="dfs-weight")
    reqs = [
        make_request("a1", [1] * 8 + [10], 1, arrival_time=0.0),
        make_request("b1", [2] * 8 + [20], 1, arrival_time=1.0),
        make_request("a2", [1] * 8 + [11], 1, arrival_time=2.0),
        make_request("a3", [1] * 8 + [12], 1, arrival_time=3.0),
        make_request("b2", [2] * 8 + [21], 1, arrival_time=4.0),
    ]
    for r in reqs:
        sched.add_request(r)
    sched._order_waiting()
    assert [r.request_id for r in sched.waiting] == ["a1", "a2", "a3", "b1", "b2"]


def test_aging_bounds_how_long_a_unique_prefix_waits():
    """One request with a unique prompt among a stream sharing a cached prefix: under lpm it
    is passed over, but once it has waited `aging_steps` steps it goes first."""
    aging = 10
    sched = make_scheduler(
        num_blocks=128,
        budget=64,
        max_num_seqs=1,
        prefix_cache="radix",
        policy="lpm",
        aging_steps=aging,
    )
    shared = [5] * 16
    sched.add_request(make_request("seed", shared + [0], 1))
    while sched.has_unfinished_requests():
        step(sched)
    loner = make_request("loner", [3] * 17, 2, arrival_time=0.5)
    sched.add_request(loner)
    waited = 0
    for i in range(200):  # a fresh sharer arrives every step, each preferred by lpm
        sched.add_request(make_request(f"s{i}", shared + [100 + i], 2, arrival_time=1.0 + i))
        step(sched)
        if loner.status != RequestStatus.WAITING:
            break
        waited += 1
    assert loner.status in (RequestStatus.RUNNING, RequestStatus.FINISHED_LENGTH)
    assert aging - 1 <= waited <= aging + 2  # passed over, but only until it aged


def test_a_higher_priority_arrival_preempts_and_the_victim_still_finishes():
    sched = make_scheduler(num_blocks=64, budget=64, max_num_seqs=2, policy="priority")
    low1 = make_request("low1", [1] * 6, 8, arrival_time=0.0)
    low2 = make_request("low2", [2] * 6, 8, arrival_time=1.0)
    low1.priority = low2.priority = 5
    sched.add_request(low1)
    sched.add_request(low2)
    step(sched)
    step(sched)
    assert {r.request_id for r in sched.running} == {"low1", "low2"}
    urgent = make_request("urgent", [3] * 6, 4, arrival_time=2.0)
    urgent.priority = 0  # smaller value = more urgent
    sched.add_request(urgent)
    out, _ = step(sched)
    assert "urgent" in out.num_scheduled_tokens
    assert out.preempted_ids == ["low2"]  # the latest arrival among the lowest priority
    assert low2.status == RequestStatus.PREEMPTED
    while sched.has_unfinished_requests():
        step(sched)
    for r in (low1, low2, urgent):
        assert r.status == RequestStatus.FINISHED_LENGTH
        assert r.output_token_ids == expected_output(r)
    assert sched.num_preemptions == 1
