"""The scheduler with the prefix cache, with aborts, and under a long random workload
(helpers and the fake model runner: scheduler_helpers.py)."""

from __future__ import annotations

import random

import pytest
from scheduler_helpers import (
    Request,
    RequestStatus,
    add_all,
    check_all_free,
    check_at_rest,
    expected_output,
    fake_token,
    make_request,
    make_requests,
    make_scheduler,
    run_to_completion,
    step,
    three_one_block_requests,
)

# ---- prefix cache through the scheduler -----------------------------------------------------


def test_a_request_sharing_a_finished_requests_prefix_starts_from_cache_hits():
    sched = make_scheduler()
    (first,) = make_requests(1, prompt_len=20, max_tokens=2, id_prefix="first")
    sched.add_request(first)
    step(sched)
    first_blocks = sched.kv.get_block_ids(first.request_id)
    run_to_completion(sched)
    check_all_free(sched)

    (second,) = make_requests(1, prompt_len=22, max_tokens=2, prefix=first.prompt_token_ids[:16])
    sched.add_request(second)
    out, _ = step(sched)
    assert out.num_scheduled_tokens == {"r0": 6}
    (new,) = out.new_requests
    assert new.num_computed_tokens == 16
    assert new.block_ids[:4] == first_blocks[:4]
    assert second.num_cached_prompt_tokens == 16
    assert sched.kv.stats.hits == 16
    assert sched.kv.stats.queries == 20 + 22
    run_to_completion(sched)
    check_all_free(sched)
    assert sched.kv.cache.cached


def test_running_requests_with_a_common_prefix_share_its_blocks():
    sched = make_scheduler()
    system = list(range(1, 17))  # 4 full blocks
    (a,) = make_requests(1, prompt_len=18, max_tokens=6, prefix=system, id_prefix="a")
    (b,) = make_requests(1, prompt_len=21, max_tokens=3, prefix=system, id_prefix="b")
    sched.add_request(a)
    step(sched)
    sched.add_request(b)
    out, _ = step(sched)
    assert out.num_scheduled_tokens == {"a0": 1, "b0": 5}
    a_blocks, b_blocks = sched.kv.req_blocks["a0"], sched.kv.req_blocks["b0"]
    assert b_blocks[:4] == a_blocks[:4]
    assert a_blocks[4] is not b_blocks[4]
    assert [blk.ref_cnt for blk in b_blocks[:4]] == [2, 2, 2, 2]

    while b.status == RequestStatus.RUNNING:
        step(sched)
    assert [blk.ref_cnt for blk in a_blocks[:4]] == [1, 1, 1, 1]  # a keeps them
    run_to_completion(sched)
    check_all_free(sched)
    assert a.output_token_ids == expected_output(a)
    assert b.output_token_ids == expected_output(b)


def test_identical_prompts_admitted_in_one_step_share_blocks_at_once():
    """The first request hashes its blocks when it is scheduled, so a sibling in the same
    step hits them (their K/V is written by this step's forward before it is read)."""
    sched = make_scheduler()
    prompt = list(range(1, 13))  # exactly 3 blocks
    a = make_request("a", prompt, 2)
    b = make_request("b", prompt, 2)
    add_all(sched, [a, b])
    out, _ = step(sched)
    assert out.num_scheduled_tokens == {"a": 12, "b": 4}  # the last block is recomputed
    assert sched.kv.get_block_ids("b")[:2] == sched.kv.get_block_ids("a")[:2]
    assert a.output_token_ids[0] == fake_token("a", 12)
    run_to_completion(sched)
    check_all_free(sched)


def test_without_prefix_caching_every_prompt_is_computed_in_full():
    sched = make_scheduler(enable_caching=False)
    prompt = list(range(1, 13))
    sched.add_request(make_request("a", prompt, 2))
    run_to_completion(sched)
    sched.add_request(make_request("b", prompt, 2))
    out, _ = step(sched)
    assert out.num_scheduled_tokens == {"b": 12}
    assert sched.kv.stats.hits == 0
    run_to_completion(sched)
    check_all_free(sched)
    assert sched.kv.cache.kind == "off"


# ---- aborts ---------------------------------------------------------------------------------


def test_aborting_a_waiting_request_drops_it_from_the_queue():
    sched = make_scheduler()
    a, b, c = make_requests(3, prompt_len=5, max_tokens=2)
    add_all(sched, [a, b, c])
    assert sched.abort_requests(["r1"]) == [b]
    assert list(sched.waiting) == [a, c]
    assert b.status == RequestStatus.FINISHED_ABORTED
    assert "r1" not in sched.requests
    out, _ = step(sched)
    assert out.finished_ids == ["r1"]
    assert list(out.num_scheduled_tokens) == ["r0", "r2"]


def test_aborting_a_running_request_frees_its_blocks_at_once():
    sched = make_scheduler(num_blocks=6)
    a, b = make_requests(2, prompt_len=20, max_tokens=4)
    add_all(sched, [a, b])
    step(sched)  # a holds 5 blocks; b cannot fit yet
    assert sched.kv.num_free_blocks == 1 and b.status == RequestStatus.WAITING
    sched.abort_requests(["r0"])
    assert sched.kv.num_free_blocks == 6
    assert sched.running == [] and a.status == RequestStatus.FINISHED_ABORTED
    check_at_rest(sched)
    out, _ = step(sched)
    assert out.finished_ids == ["r0"] and out.num_scheduled_tokens == {"r1": 20}


def test_a_request_aborted_between_schedule_and_update_gets_no_token():
    sched = make_scheduler()
    a, b = make_requests(2, prompt_len=6, max_tokens=3)
    add_all(sched, [a, b])
    out, updates = step(sched, abort_mid_step=["r1"])
    assert set(out.num_scheduled_tokens) == {"r0", "r1"}
    assert [u.request_id for u in updates] == ["r0"]
    assert b.num_output_tokens == 0 and b.status == RequestStatus.FINISHED_ABORTED
    run_to_completion(sched)
    check_all_free(sched)


def test_aborting_a_preempted_request_removes_it_from_the_queue():
    sched = make_scheduler(num_blocks=5)
    a, b, c = three_one_block_requests(arrivals=(0.0, 1.0, 2.0))
    add_all(sched, [a, b, c])
    step(sched)
    step(sched)
    assert c.status == RequestStatus.PREEMPTED
    assert sched.abort_requests(["C"]) == [c]
    assert c not in sched.waiting and c.status == RequestStatus.FINISHED_ABORTED
    run_to_completion(sched)
    check_all_free(sched)


def test_aborting_unknown_or_finished_requests_does_nothing():
    sched = make_scheduler()
    (a,) = make_requests(1, prompt_len=3, max_tokens=1)
    sched.add_request(a)
    run_to_completion(sched)
    assert sched.abort_requests(["r0", "nobody"]) == []
    assert a.status == RequestStatus.FINISHED_LENGTH


# ---- a long random workload -----------------------------------------------------------------


@pytest.mark.parametrize(
    "seed, cache, policy",
    [
        (0, "hash", "fcfs"),
        (1, "hash", "fcfs"),
        (2, "none", "fcfs"),
        (3, "radix", "fcfs"),
        (4, "radix", "lpm"),
        (5, "radix", "dfs-weight"),
        (6, "hash", "lpm"),
        (7, "hash", "priority"),
        (8, "radix", "priority"),
    ],
    ids=lambda v: str(v),
)
def test_a_random_workload_keeps_every_invariant_and_leaks_nothing(seed, cache, policy):
    """Random arrivals, lengths and aborts on a small pool: preemptions happen, every
    request still gets exactly its tokens, and at the end every block is free."""
    rng = random.Random(seed)
    num_blocks, block_size = 24, 4
    enable_caching = cache != "none"
    sched = make_scheduler(
        num_blocks=num_blocks,
        block_size=block_size,
        budget=24,
        max_num_seqs=6,
        max_model_len=256,
        enable_caching=enable_caching,
        prefix_cache="radix" if cache == "radix" else "hash",
        policy=policy,
        aging_steps=20,
        prefill_cap=(0, 5, 11)[seed % 3],
    )
    system_prompts = [[rng.randrange(1, 900) for _ in range(n)] for n in (8, 13)]
    requests: list[Request] = []
    aborted: set[str] = set()
    num_requests = 80
    steps = 0
    while len(requests) < num_requests or sched.has_unfinished_requests():
        steps += 1
        assert steps < 3000, "the scheduler stopped making progress"
        while len(requests) < num_requests and rng.random() < 0.4:
            prefix = rng.choice([[], *system_prompts])
            tail = [rng.randrange(1, 900) for _ in range(rng.randint(1, 30))]
            req = make_request(
                f"q{len(requests)}",
                prefix + tail,  # at most 43 tokens + 20 outputs: 16 blocks fit the pool
                rng.randint(1, 20),
                block_size=block_size,
                arrival_time=float(len(requests)),
            )
            req.priority = rng.randint(0, 3)
            requests.append(req)
            sched.add_request(req)
        live = list(sched.requests)
        if live and rng.random() < 0.03:
            aborted.update(r.request_id for r in sched.abort_requests([rng.choice(live)]))
        mid_step = []
        if sched.running and rng.random() < 0.02:
            mid_step = [rng.choice(sched.running).request_id]
        step(sched, abort_mid_step=mid_step)
        aborted.update(mid_step)

    assert steps >= 200
    assert sched.num_preemptions > 0
    assert 0 < len(aborted) < num_requests
    for req in requests:
        if req.request_id in aborted:
            assert req.status == RequestStatus.FINISHED_ABORTED
        else:
            assert req.status == RequestStatus.FINISHED_LENGTH, req
            assert req.output_token_ids == expected_output(req), req
    check_all_free(sched)
    if cache == "radix":
        assert sched.kv.stats.hits > 0
        nodes = sched.kv.cache.tree.nodes()
        assert nodes and all(b.ref_cnt == 0 for n in nodes for b in n.blocks)
    elif enable_caching:
        assert sched.kv.stats.hits > 0
        assert sched.kv.cache.cached
        for block_hash, block in sched.kv.cache.cached.items():
            assert block.block_hash == block_hash and block.ref_cnt == 0
    else:
        assert sched.kv.cache.kind == "off" and sched.kv.stats.hits == 0
