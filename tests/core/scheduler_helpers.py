"""Helpers of the scheduler tests: a scheduler over a small pool, requests, and a fake model
runner whose token at each position depends only on the request id and the position (so a
request's output is the same whatever the budget, the pool size or the preemptions), with
the invariants of DESIGN.md §2 checked after every step."""

from __future__ import annotations

import random
import zlib
from collections.abc import Iterable, Sequence

from cadence.config import SchedulerConfig
from cadence.core.hash_prefix_cache import make_block_hasher
from cadence.core.kv_cache import KVCacheManager
from cadence.core.request import Request, RequestStatus
from cadence.core.scheduler import Scheduler
from cadence.core.scheduler_output import RequestUpdate, SampledTokens, SchedulerOutput
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
    lora_slots: int = 0,
    prefill_cap: int = 0,
) -> Scheduler:
    kv = KVCacheManager(num_blocks, block_size, enable_caching, prefix_cache)
    config = SchedulerConfig(
        max_num_batched_tokens=budget,
        max_num_seqs=max_num_seqs,
        max_model_len=max_model_len,
        scheduling_policy=policy,
        scheduling_aging_steps=aging_steps,
        max_prefill_tokens_while_decoding=prefill_cap,
    )
    return Scheduler(config, kv, num_lora_slots=lora_slots)


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


def three_one_block_requests(arrivals: Sequence[float], max_tokens: int = 3) -> list[Request]:
    names = ["A", "B", "C"]
    return [
        make_request(n, [10 * i + k for k in range(1, 5)], max_tokens, arrival_time=t)
        for i, (n, t) in enumerate(zip(names, arrivals))
    ]
