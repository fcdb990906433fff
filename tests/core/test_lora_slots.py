"""The scheduler's LoRA slots: an adapter's request runs only with its adapter in one of
the worker's slots; it waits rather than take a slot a running request uses, and those
behind it (the base model, adapters already placed) go first; slots are reused least
recently used first, and each placement is a load the worker is told of."""

from __future__ import annotations

from scheduler_helpers import make_requests, make_scheduler, run_to_completion, step

from cadence.lora_request import LoRARequest

A, B, C = (LoRARequest(n, i + 1, f"/adapters/{n}") for i, n in enumerate("abc"))


def with_adapters(adapters, **kw):
    reqs = make_requests(len(adapters), **{"prompt_len": 8, "max_tokens": 4, **kw})
    for req, lora in zip(reqs, adapters):
        req.lora = lora
        req.block_hashes = []  # (rehashed under the adapter's namespace)
        req.update_block_hashes()
    return reqs


def test_a_request_waits_for_a_slot_and_those_behind_it_go_first():
    sched = make_scheduler(lora_slots=2)
    first = with_adapters([A, B], max_tokens=6)
    for r in first:
        sched.add_request(r)
    out, _ = step(sched)
    assert [(ld.slot, ld.lora.lora_name) for ld in out.lora_loads] == [(0, "a"), (1, "b")]
    later = with_adapters([C, None, A], id_prefix="w")
    for r in later:
        sched.add_request(r)
    out, _ = step(sched)
    # c finds both slots in use: it waits; the base request and a's go past it
    assert set(out.num_scheduled_tokens) == {"r0", "r1", "w1", "w2"}
    assert out.lora_loads == [] and [r.request_id for r in sched.waiting] == ["w0"]
    assert sched.stats().lora.waiting == {"c": 1}
    assert sched.stats().lora.running == {"a": 2, "b": 1}
    while "w0" not in {r.request_id for r in sched.running}:
        out, _ = step(sched)
    # b's slot freed first (r1 ended before a's last request): c takes it
    assert [(ld.slot, ld.lora.lora_name) for ld in out.lora_loads] == [(1, "c")]
    run_to_completion(sched)
    assert sched.stats().lora.slot_loads == 3


def test_the_least_recently_used_idle_slot_is_taken():
    sched = make_scheduler(lora_slots=2)
    for lora in (A, B, A, C):  # a used again after b: b's slot is the older one
        (req,) = with_adapters([lora], id_prefix=lora.lora_name)
        sched.add_request(req)
        run_to_completion(sched)
    assert [h.lora_name for h in sched.loras.held] == ["a", "c"]


def test_without_adapters_nothing_changes():
    sched = make_scheduler()
    for r in make_requests(3, prompt_len=8, max_tokens=2):
        sched.add_request(r)
    out, _ = step(sched)
    assert out.lora_loads == [] and len(out.num_scheduled_tokens) == 3
    assert sched.stats().lora is None
