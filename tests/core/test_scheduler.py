"""The scheduler driven by a fake model runner: schedule -> scripted tokens -> update.

No model and no tensors. The fake "model" samples a token that depends only on the request
id and its position, so a request's output is the same whatever the budget, the pool size or
the number of preemptions. Every step checks the invariants of DESIGN.md §2.
"""

from __future__ import annotations

import random
import zlib
from collections.abc import Iterable, Sequence

import pytest

from cadence.config import SchedulerConfig
from cadence.core.kv_cache import KVCacheManager, make_block_hasher
from cadence.core.request import Request, RequestStatus
from cadence.core.scheduler import RequestUpdate, SampledTokens, Scheduler, SchedulerOutput
from cadence.sampling_params import SamplingParams

BS = 4


# ---- helpers --------------------------------------------------------------------------------


def make_scheduler(
    num_blocks: int = 64,
    block_size: int = BS,
    budget: int = 64,
    max_num_seqs: int = 16,
    max_model_len: int = 1024,
    enable_caching: bool = True,
    prefix_cache: str = "hash",
    policy: str = "fcfs",
    aging_steps: int = 200,
) -> Scheduler:
    kv = KVCacheManager(num_blocks, block_size, enable_caching, prefix_cache)
    config = SchedulerConfig(
        max_num_batched_tokens=budget,
        max_num_seqs=max_num_seqs,
        max_model_len=max_model_len,
        scheduling_policy=policy,
        scheduling_aging_steps=aging_steps,
    )
    return Scheduler(config, kv)


def make_request(
    rid: str,
    prompt: Sequence[int],
    max_tokens: int,
    *,
    block_size: int = BS,
    arrival_time: float = 0.0,
) -> Request:
    return Request(
        rid,
        list(prompt),
        SamplingParams(max_tokens=max_tokens),
        eos_token_ids=(),  # only max_tokens (or max_model_len) ends a request
        arrival_time=arrival_time,
        block_hasher=make_block_hasher(block_size),
    )


def make_requests(
    n: int,
    prompt_len: int,
    max_tokens: int,
    *,
    block_size: int = BS,
    prefix: Sequence[int] = (),
    id_prefix: str = "r",
    first_arrival: float = 0.0,
) -> list[Request]:
    """n requests with distinct random prompts (after an optional shared prefix).

    Ids are f"{id_prefix}{i}"; arrival times increase with i.
    """
    out = []
    for i in range(n):
        rid = f"{id_prefix}{i}"
        rng = random.Random(rid)
        tail = [rng.randrange(1, 50_000) for _ in range(prompt_len - len(prefix))]
        out.append(
            make_request(
                rid,
                list(prefix) + tail,
                max_tokens,
                block_size=block_size,
                arrival_time=first_arrival + i,
            )
        )
    return out


def fake_token(request_id: str, position: int) -> int:
    """The fake model: the token sampled at `position` depends on nothing else."""
    return 100_000 + zlib.crc32(f"{request_id}:{position}".encode()) % 1000


def expected_output(req: Request) -> list[int]:
    n = req.sampling_params.max_tokens
    return [fake_token(req.request_id, req.num_prompt_tokens + k) for k in range(n)]


def blocks_for(num_tokens: int, block_size: int) -> int:
    return -(-num_tokens // block_size)


def check_scheduled(sched: Scheduler, out: SchedulerOutput) -> None:
    """Invariants right after schedule(), before the worker runs."""
    cfg, kv = sched.config, sched.kv
    assert out.total_num_scheduled_tokens == sum(out.num_scheduled_tokens.values())
    assert out.total_num_scheduled_tokens <= cfg.max_num_batched_tokens
    assert all(n > 0 for n in out.num_scheduled_tokens.values())
    assert len(sched.running) <= cfg.max_num_seqs
    running_ids = {r.request_id for r in sched.running}
    assert set(out.num_scheduled_tokens) <= running_ids
    for req in sched.running:
        scheduled = out.num_scheduled_tokens.get(req.request_id, 0)
        assert req.num_computed_tokens + scheduled <= req.num_tokens
        # A request's blocks cover exactly its computed + scheduled tokens.
        expected = blocks_for(req.num_computed_tokens + scheduled, kv.block_size)
        assert len(kv.get_block_ids(req.request_id)) == expected, req
    for rid in out.preempted_ids:
        req = sched.requests[rid]
        assert req in sched.waiting and req.status == RequestStatus.PREEMPTED
        assert rid not in out.num_scheduled_tokens
    check_at_rest(sched)


def check_at_rest(sched: Scheduler) -> None:
    """Invariants that hold between steps."""
    kv = sched.kv
    kv.check_integrity()
    assert len(sched.running) <= sched.config.max_num_seqs
    for req in sched.waiting:
        assert req.num_computed_tokens == 0, req
        assert kv.get_block_ids(req.request_id) == [], req
        assert req.status in (RequestStatus.WAITING, RequestStatus.PREEMPTED)
    for req in sched.running:
        assert req.status == RequestStatus.RUNNING
    assert set(kv.req_blocks) <= {r.request_id for r in sched.running}


def step(
    sched: Scheduler, abort_mid_step: Iterable[str] = ()
) -> tuple[SchedulerOutput, list[RequestUpdate]]:
    """One engine step with the fake model; checks the invariants before and after."""
    out = sched.schedule()
    check_scheduled(sched, out)
    # A request samples when this step reaches the end of its known tokens. Decide now:
    # update() advances num_computed_tokens.
    sampled = {}
    for rid, n in out.num_scheduled_tokens.items():
        req = sched.requests[rid]
        if req.num_computed_tokens + n == req.num_tokens:
            sampled[rid] = fake_token(rid, req.num_tokens)
    sched.abort_requests(list(abort_mid_step))
    updates = sched.update(out, SampledTokens(sampled=sampled))
    check_at_rest(sched)
    for req in sched.running:  # after update: blocks cover exactly the computed tokens
        assert len(sched.kv.get_block_ids(req.request_id)) == blocks_for(
            req.num_computed_tokens, sched.kv.block_size
        ), req
    return out, updates


def run_to_completion(sched: Scheduler, max_steps: int = 1000) -> int:
    steps = 0
    while sched.has_unfinished_requests():
        step(sched)
        steps += 1
        assert steps < max_steps, "the scheduler stopped making progress"
    return steps


def add_all(sched: Scheduler, reqs: Iterable[Request]) -> None:
    for r in reqs:
        sched.add_request(r)


def check_all_free(sched: Scheduler) -> None:
    kv = sched.kv
    kv.check_integrity()
    assert kv.num_free_blocks == kv.pool.num_blocks
    assert not kv.req_blocks
    assert not sched.requests and not sched.running and not sched.waiting


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


def test_output_does_not_depend_on_the_budget():
    outputs = []
    for budget in (1, 3, 7, 64):
        sched = make_scheduler(budget=budget, max_num_seqs=4)
        reqs = make_requests(5, prompt_len=9, max_tokens=5)
        add_all(sched, reqs)
        run_to_completion(sched)
        check_all_free(sched)
        outputs.append([r.output_token_ids for r in reqs])
    assert all(o == outputs[0] for o in outputs)
    assert outputs[0] == [expected_output(r) for r in reqs]


# ---- preemption -----------------------------------------------------------------------------


def _three_one_block_requests(arrivals: Sequence[float], max_tokens: int = 3) -> list[Request]:
    names = ["A", "B", "C"]
    return [
        make_request(n, [10 * i + k for k in range(1, 5)], max_tokens, arrival_time=t)
        for i, (n, t) in enumerate(zip(names, arrivals))
    ]


def test_preemption_takes_the_latest_arrival_not_yet_scheduled_this_step():
    """Running order A, B, C; A arrived last but is already scheduled, so C is the victim."""
    sched = make_scheduler(num_blocks=4)
    a, b, c = _three_one_block_requests(arrivals=(5.0, 1.0, 2.0))
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
    a, b, c = _three_one_block_requests(arrivals=(0.0, 1.0, 2.0))
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
    a, b, c = _three_one_block_requests(arrivals=(0.0, 1.0, 2.0))
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
    assert sched.kv.pool.lookup(c.block_hashes[0]).block_id == c_first_block
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
    assert sched.kv.pool.cached


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
    assert not sched.kv.pool.cached


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
    a, b, c = _three_one_block_requests(arrivals=(0.0, 1.0, 2.0))
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
        nodes = sched.kv.pool.tree.nodes()
        assert nodes and all(b.ref_cnt == 0 for n in nodes for b in n.blocks)
    elif enable_caching:
        assert sched.kv.stats.hits > 0
        assert sched.kv.pool.cached
        for block_hash, block in sched.kv.pool.cached.items():
            assert block.block_hash == block_hash and block.ref_cnt == 0
    else:
        assert not sched.kv.pool.cached and sched.kv.stats.hits == 0
