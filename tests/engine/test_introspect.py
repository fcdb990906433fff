"""The core's answers to the API server's questions (steps, requests, profiler), asked
in-process of an offline engine."""

from __future__ import annotations

import pytest
from model_helpers import make_prompts

from cadence import LLM, SamplingParams
from cadence.engine import protocol as P
from cadence.engine.introspect import Introspection


@pytest.fixture(scope="module")
def llm(tiny_model_dir):
    return LLM(tiny_model_dir("llama"), dtype="float32", max_num_batched_tokens=16)


def ask(intro: Introspection, method: str, **args) -> P.EngineCallReply:
    reply = intro.answer(P.EngineCall(7, method, args))
    assert reply.call_id == 7
    return reply


def test_requests_lists_what_the_core_holds_with_its_state(llm):
    core = llm.engine
    intro = Introspection(core)
    prompts = make_prompts(512, [20, 5], seed=8)
    params = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
    for i, p in enumerate(prompts):
        core.add_request(f"q{i}", p, params, arrival_time=1000.0 + i)
    rows = ask(intro, "requests").result["requests"]
    assert [(r["id"], r["state"], r["prompt_tokens"]) for r in rows] == [
        ("q0", "waiting", 20),
        ("q1", "waiting", 5),
    ]
    core.step()  # q0 takes the whole budget of 16 tokens: a chunk of its prompt
    rows = {r["id"]: r for r in ask(intro, "requests", limit=10).result["requests"]}
    assert rows["q0"]["state"] == "running" and rows["q0"]["computed_tokens"] == 16
    one = ask(intro, "requests", limit=1).result
    assert one["total"] == 2 and len(one["requests"]) == 1

    def without_age(row: dict) -> dict:  # (age_s moves with the clock between two asks)
        return {k: v for k, v in row.items() if k != "age_s"}

    assert without_age(one["requests"][0]) == without_age(rows["q0"])
    while core.has_unfinished_requests():
        core.step()
    assert ask(intro, "requests").result == {"total": 0, "requests": []}
    steps = ask(intro, "steps", since=0).result
    assert steps["capacity"] == 1024 and steps["num_steps"] == len(steps["steps"]) >= 4


def test_bad_calls_are_answered_with_an_error_not_raised(llm):
    intro = Introspection(llm.engine)
    assert "unknown call" in ask(intro, "reboot").error
    assert ask(intro, "steps", bogus=1).error  # an argument the method does not take
    no_dir = ask(intro, "start_profile")
    assert no_dir.result is None and "--profile-dir" in no_dir.error
    llm.engine.config.profile_dir = "/tmp"
    try:
        assert "no profile" in ask(Introspection(llm.engine), "stop_profile").error
    finally:
        llm.engine.config.profile_dir = None
