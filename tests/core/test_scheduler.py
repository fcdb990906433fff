"""The scheduler driven by a fake model runner: schedule -> scripted tokens -> update.

No model and no tensors. The fake "model" samples a token that depends only on the request
id and its position, so a request's output is the same whatever the budget, the pool size or
the number of preemptions. Every step checks the invariants of DESIGN.md §2.
"""

from __future__ import annotations

import pytest
from scheduler_helpers import (
    RequestStatus,
    add_all,
    check_all_free,
    expected_output,
    fake_token,
    make_request,
    make_requests,
    make_scheduler,
    run_to_completion,
    step,
    three_one_block_requests,
)

# ---- one request ----------------------------------------------------------------------------


def test_a_request_prefills_in_one_step_then_decodes_one_token_per_step():
    sched = make_scheduler()
    (req,) = make_requests(1, prompt_len=10, max_tokens=3)
    sched.add_request(req)

    out, updates = step(sched)
    assert out.num_scheduled_tokens == {"r0": 10}
    assert [u.new_token_ids for u in updates] == [[fake_token("r0", 10)]]
    assert req.num_computed_tokens == 10 and req.num_output_tokens == 1

    out, updates = step(sched)
    assert out.num_scheduled_tokens == {"r0": 1}
    assert not updates[0].finished

    out, updates = step(sched)
    assert out.num_scheduled_tokens == {"r0": 1}
    assert updates[0].finished and updates[0].finish_reason == "length"
    assert req.status == RequestStatus.FINISHED_LENGTH
    assert req.output_token_ids == expected_output(req)
    check_all_free(sched)

    out = sched.schedule()
    assert out.is_empty
    assert out.finished_ids == ["r0"]  # told to the worker on the next step
    assert sched.schedule().finished_ids == []


def test_the_worker_sees_a_request_in_full_once_then_only_deltas():
    sched = make_scheduler()
    (req,) = make_requests(1, prompt_len=4, max_tokens=3)
    sched.add_request(req)

    out, _ = step(sched)
    (new,) = out.new_requests
    assert not out.cached_requests
    assert new.request_id == "r0" and new.prompt_token_ids == req.prompt_token_ids
    assert new.block_ids == [0] and new.num_computed_tokens == 0

    out, _ = step(sched)  # the 5th token needs a second block
    assert not out.new_requests
    (cached,) = out.cached_requests
    assert cached.new_block_ids == [1] and cached.num_computed_tokens == 4
    assert not cached.resumed

    out, _ = step(sched)  # the 6th token fits in the second block
    assert out.cached_requests[0].new_block_ids == []


def test_a_request_stops_at_max_model_len():
    sched = make_scheduler(max_model_len=12)
    (req,) = make_requests(1, prompt_len=10, max_tokens=100)
    sched.add_request(req)
    run_to_completion(sched)
    assert req.num_output_tokens == 2
    assert req.status == RequestStatus.FINISHED_LENGTH
    check_all_free(sched)


def test_a_request_id_cannot_be_used_twice_while_it_lives():
    sched = make_scheduler()
    sched.add_request(make_request("x", [1, 2, 3], 2))
    with pytest.raises(ValueError):
        sched.add_request(make_request("x", [4, 5, 6], 2))


# ---- order: running first, FCFS, chunked prefill --------------------------------------------


def test_running_decodes_come_before_a_waiting_prefill_and_share_its_step():
    sched = make_scheduler(budget=16)
    (a,) = make_requests(1, prompt_len=4, max_tokens=10)
    b = make_request("r1", list(range(1, 41)), 10)  # a 40-token prompt
    sched.add_request(a)
    step(sched)  # a prefilled
    sched.add_request(b)

    out, _ = step(sched)
    assert list(out.num_scheduled_tokens.items()) == [("r0", 1), ("r1", 15)]
    assert [n.request_id for n in out.new_requests] == ["r1"]
    assert [c.request_id for c in out.cached_requests] == ["r0"]

    out, _ = step(sched)  # b is running now, still behind a
    assert list(out.num_scheduled_tokens.items()) == [("r0", 1), ("r1", 15)]


def test_running_requests_can_take_the_whole_budget_from_waiting_ones():
    sched = make_scheduler(budget=2)
    a, b, c = make_requests(3, prompt_len=2, max_tokens=3)
    add_all(sched, [a, b])
    out, _ = step(sched)
    assert out.num_scheduled_tokens == {"r0": 2}
    out, _ = step(sched)
    assert out.num_scheduled_tokens == {"r0": 1, "r1": 1}
    sched.add_request(c)
    out, _ = step(sched)  # a decodes, b continues its prefill: nothing left for c
    assert out.num_scheduled_tokens == {"r0": 1, "r1": 1}
    assert c.status == RequestStatus.WAITING and c.num_computed_tokens == 0


def test_waiting_requests_are_admitted_first_come_first_served():
    sched = make_scheduler(budget=10)
    reqs = make_requests(3, prompt_len=8, max_tokens=4)
    add_all(sched, reqs)

    out, _ = step(sched)
    assert list(out.num_scheduled_tokens.items()) == [("r0", 8), ("r1", 2)]
    out, _ = step(sched)
    assert list(out.num_scheduled_tokens.items()) == [("r0", 1), ("r1", 6), ("r2", 3)]
    assert [r.request_id for r in sched.running] == ["r0", "r1", "r2"]
    run_to_completion(sched)
    assert all(r.output_token_ids == expected_output(r) for r in reqs)
    check_all_free(sched)


def test_a_waiting_request_that_does_not_fit_holds_back_the_ones_behind_it():
    """FCFS: nobody jumps the queue for lack of memory, even one that would fit."""
    sched = make_scheduler(num_blocks=6, budget=100)
    a = make_request("A", list(range(1, 13)), 5)  # 3 blocks
    b = make_request("B", list(range(20, 36)), 5)  # 4 blocks: never fits beside A
    c = make_request("C", [40, 41], 5)  # 1 block: would fit
    add_all(sched, [a, b, c])
    for _ in range(5):
        out, _ = step(sched)
        assert list(out.num_scheduled_tokens) == ["A"]
    assert a.status == RequestStatus.FINISHED_LENGTH
    out, _ = step(sched)
    assert list(out.num_scheduled_tokens) == ["B", "C"]
    run_to_completion(sched)
    check_all_free(sched)


def test_max_num_seqs_caps_the_running_batch():
    sched = make_scheduler(budget=100, max_num_seqs=2)
    reqs = make_requests(3, prompt_len=3, max_tokens=3)
    add_all(sched, reqs)
    out, _ = step(sched)
    assert list(out.num_scheduled_tokens) == ["r0", "r1"]
    out, _ = step(sched)
    assert list(out.num_scheduled_tokens) == ["r0", "r1"]  # r2 waits despite the budget
    out, _ = step(sched)  # r0 and r1 finish in this step's update
    assert list(out.num_scheduled_tokens) == ["r0", "r1"]
    out, _ = step(sched)
    assert list(out.num_scheduled_tokens) == ["r2"]


def test_a_prompt_longer_than_the_budget_is_prefilled_in_chunks_and_samples_only_at_the_end():
    sched = make_scheduler(budget=16)
    (req,) = make_requests(1, prompt_len=50, max_tokens=2)
    sched.add_request(req)
    computed = []
    for expected_chunk in (16, 16, 16):
        out, updates = step(sched)
        assert out.num_scheduled_tokens == {"r0": expected_chunk}
        assert updates == [] and req.num_output_tokens == 0
        computed.append(req.num_computed_tokens)
    assert computed == [16, 32, 48]
    out, updates = step(sched)
    assert out.num_scheduled_tokens == {"r0": 2}
    assert [u.new_token_ids for u in updates] == [[fake_token("r0", 50)]]
    out, updates = step(sched)
    assert out.num_scheduled_tokens == {"r0": 1} and updates[0].finished
    check_all_free(sched)


def test_while_a_request_decodes_prompt_tokens_per_step_are_bounded():
    """A decoding request's next token waits for the step: prompts (a running one's chunks
    and new ones together) get at most the cap beside it, the full budget without it."""
    sched = make_scheduler(budget=64, prefill_cap=8)
    a = make_request("a", list(range(1, 5)), 20)
    sched.add_request(a)
    out, _ = step(sched)
    assert out.num_scheduled_tokens == {"a": 4}  # nobody decodes yet: the budget
    b = make_request("b", list(range(101, 113)), 4)  # (no prefix shared with a or c)
    c = make_request("c", list(range(201, 207)), 4)
    add_all(sched, [b, c])
    out, _ = step(sched)
    assert out.num_scheduled_tokens == {"a": 1, "b": 8}
    out, _ = step(sched)  # b's last 4 come first (running), c takes what is left
    assert out.num_scheduled_tokens == {"a": 1, "b": 4, "c": 4}
    out, _ = step(sched)
    assert out.num_scheduled_tokens == {"a": 1, "b": 1, "c": 2}


def test_a_burst_of_prompts_with_nobody_decoding_takes_the_whole_budget():
    sched = make_scheduler(budget=32, prefill_cap=4)
    reqs = make_requests(4, prompt_len=8, max_tokens=3)
    add_all(sched, reqs)
    out, _ = step(sched)
    assert sum(out.num_scheduled_tokens.values()) == 32


@pytest.mark.parametrize("prefill_cap", [0, 1, 2, 5])
def test_output_does_not_depend_on_the_budget(prefill_cap):
    outputs = []
    for budget in (1, 3, 7, 64):
        sched = make_scheduler(budget=budget, max_num_seqs=4, prefill_cap=prefill_cap)
        reqs = make_requests(5, prompt_len=9, max_tokens=5)
        add_all(sched, reqs)
        run_to_completion(sched)
        check_all_free(sched)
        outputs.append([r.output_token_ids for r in reqs])
    assert all(o == outputs[0] for o in outputs)
    assert outputs[0] == [expected_output(r) for r in reqs]


# ---- preemption -----------------------------------------------------------------------------


def test_preemption_takes_the_latest_arrival_not_yet_scheduled_this_step():
    """Running order A, B, C; A arrived last but is already scheduled, so C is the victim."""
    sched = make_scheduler(num_blocks=4)
    a, b, c = three_one_block_requests(arrivals=(5.0, 1.0, 2.0))
    add_all(sched, [a, b, c])
    step(sched)  # each holds one block; one is free
    d = make_request("D", [7, 7, 7], 3, arrival_time=6.0)
    sched.add_request(d)

    # A takes the free block for its 5th token; B finds none and preempts C.
    out, _ = step(sched)
    assert out.preempted_ids == ["C"]
    assert list(out.num_scheduled_tokens) == ["A", "B"]  # and no waiting request this step
    assert list(sched.waiting) == [c, d]  # the victim goes to the FRONT of the queue
    assert c.status == RequestStatus.PREEMPTED
    assert c.num_computed_tokens == 0 and c.num_preemptions == 1
    assert sched.kv.get_block_ids("C") == []
    assert c.num_output_tokens == 1  # outputs are kept; only their K/V is recomputed
    assert sched.num_preemptions == 1 and sched.stats().num_preemptions == 1

    resumed = []
    while sched.has_unfinished_requests():
        out, _ = step(sched)
        resumed += [x.request_id for x in out.cached_requests if x.resumed]
    assert resumed == ["C"]
    for r in (a, b, c, d):
        assert r.status == RequestStatus.FINISHED_LENGTH
        assert r.output_token_ids == expected_output(r)
    check_all_free(sched)


def test_a_request_that_is_the_latest_arrival_preempts_itself():
    sched = make_scheduler(num_blocks=5)
    a, b, c = three_one_block_requests(arrivals=(0.0, 1.0, 2.0))
    add_all(sched, [a, b, c])
    step(sched)
    out, _ = step(sched)  # A and B take the two free blocks; C has none and is the victim
    assert out.preempted_ids == ["C"]
    assert list(out.num_scheduled_tokens) == ["A", "B"]
    assert sched.waiting[0] is c
    run_to_completion(sched)
    assert c.output_token_ids == expected_output(c)
    check_all_free(sched)


def test_preemption_takes_the_lowest_priority_before_the_latest_arrival():
    """A larger priority value is a lower priority; arrival order only breaks ties."""
    sched = make_scheduler(num_blocks=4)
    a, b, c = three_one_block_requests(arrivals=(0.0, 1.0, 2.0))
    b.priority = 1
    add_all(sched, [a, b, c])
    step(sched)
    out, _ = step(sched)  # A takes the free block; B finds none: B (priority 1) is the victim
    assert out.preempted_ids == ["B"]
    assert list(out.num_scheduled_tokens) == ["A", "C"]
    run_to_completion(sched)
    assert b.output_token_ids == expected_output(b)
    check_all_free(sched)


def test_a_preempted_request_resumes_from_its_cached_prefix():
    """Freed tail first, the victim's full first block survives and is a hit on its return."""
    sched = make_scheduler(num_blocks=5)
    a = make_request("A", [1, 2, 3, 4], 2, arrival_time=0.0)
    b = make_request("B", [5, 6, 7, 8], 2, arrival_time=1.0)
    c = make_request("C", [9, 10, 11, 12, 13, 14], 2, arrival_time=2.0)
    add_all(sched, [a, b, c])
    step(sched)  # A: 1 block, B: 1 block, C: 2 blocks (the first full, cached); 1 free
    c_first_block = sched.kv.get_block_ids("C")[0]

    out, _ = step(sched)  # B preempts C; C's partial block is reused, its full one stays
    assert out.preempted_ids == ["C"]
    assert sched.kv.cache.lookup(c.block_hashes[0]).block_id == c_first_block
    assert sched.kv.stats.hits == 0

    out, _ = step(sched)  # A and B finished; C comes back: 7 tokens, 4 of them cached
    assert out.num_scheduled_tokens == {"C": 3}
    (back,) = out.cached_requests
    assert back.request_id == "C" and back.resumed
    assert back.new_block_ids[0] == c_first_block and len(back.new_block_ids) == 2
    assert back.num_computed_tokens == 4
    assert sched.kv.stats.hits == 4
    assert c.num_cached_prompt_tokens == 0  # reported for the first admission only
    run_to_completion(sched)
    assert c.output_token_ids == expected_output(c)
    check_all_free(sched)
