"""Structured outputs in the engine, offline, with the real SmolLM2: every output matches its
constraint, whatever else shares the batch, under preemption, with n > 1, and with
jump-forward on or off."""

from __future__ import annotations

import json
import re
import sys
import threading
from pathlib import Path

import jsonschema
import pytest

from cadence import LLM, SamplingParams
from cadence.sampling_params import StructuredOutputsParams as S

sys.path.insert(0, str(Path(__file__).parent.parent / "structured"))
from schema_cases import SCHEMA_CASES  # noqa: E402


@pytest.fixture(scope="module")
def llm():
    return LLM(dtype="float32", kv_cache_memory=256 * 2**20)


def chat(prompt: str) -> list[dict]:
    return [{"role": "user", "content": prompt + " Answer in JSON."}]


def greedy(so: S | None = None, max_tokens: int = 256, **kw) -> SamplingParams:
    return SamplingParams(temperature=0, max_tokens=max_tokens, structured_outputs=so, **kw)


def cases_run(jump_forward: bool) -> list:
    """Every schema case with jump-forward (the default); every third one without it (the
    masks are the same grammar's: the mask-only run checks the other path, not the cases)."""
    return SCHEMA_CASES if jump_forward else SCHEMA_CASES[::3]


@pytest.fixture(scope="module")
def schema_runs(llm) -> dict[bool, tuple[list, int]]:
    """jump_forward -> (outputs of every schema case, engine steps taken), run once. The
    grammars are compiled (and the prompts cached) first, so that neither run's step count
    includes steps taken while a request waited for its grammar."""
    llm.chat(
        [chat(p) for _, p, _ in SCHEMA_CASES],
        [greedy(S(json=schema), max_tokens=1) for _, _, schema in SCHEMA_CASES],
        use_tqdm=False,
    )
    runs = {}
    for jump_forward in (True, False):
        llm.engine.config.structured.jump_forward = jump_forward
        before = llm.engine.scheduler.step_count
        try:
            outs = llm.chat(
                [chat(p) for _, p, _ in cases_run(jump_forward)],
                [greedy(S(json=schema)) for _, _, schema in cases_run(jump_forward)],
                use_tqdm=False,
            )
        finally:
            llm.engine.config.structured.jump_forward = True
        runs[jump_forward] = (outs, llm.engine.scheduler.step_count - before)
    return runs


@pytest.mark.parametrize("jump_forward", [True, False], ids=["jump-forward", "mask-only"])
def test_every_schema_output_parses_and_validates(schema_runs, jump_forward):
    outs, _ = schema_runs[jump_forward]
    assert len(outs) == len(cases_run(jump_forward))
    for (name, _, schema), out in zip(cases_run(jump_forward), outs):
        sample = out.outputs[0]
        assert sample.finish_reason == "stop", (name, sample.text)
        jsonschema.validate(json.loads(sample.text), schema)


def test_jump_forward_saves_sampling_steps(schema_runs):
    """A batch takes a step per token of its longest output, less that output's forced
    tokens. The two runs' outputs differ (a forced string is tokenized canonically, which
    the model would not always choose), so each run's steps are counted against its own
    longest output."""

    def steps_past_longest(run) -> int:
        outs, steps = run
        return steps - max(len(o.outputs[0].token_ids) for o in outs)

    assert steps_past_longest(schema_runs[True]) < steps_past_longest(schema_runs[False])


def test_same_schema_compiles_once(llm):
    stats = llm.engine.grammars.stats
    before = stats.compiles
    schema = {"type": "object", "properties": {"q": {"type": "integer"}}, "required": ["q"]}
    prompts = [chat(f"Give the number {i}.") for i in range(4)]
    llm.chat(prompts, greedy(S(json=schema), 16), use_tqdm=False)
    llm.chat(prompts[:1], greedy(S(json=json.dumps(schema)), 16), use_tqdm=False)
    assert stats.compiles == before + 1


def test_constrained_and_free_requests_share_a_batch(llm):
    free_prompts = [chat("Tell me about the sea."), chat("Name a color.")]
    alone = llm.chat(free_prompts, greedy(max_tokens=24), use_tqdm=False)
    schema = SCHEMA_CASES[0][2]
    mixed = llm.chat(
        [free_prompts[0], chat("Describe Bob, 40."), free_prompts[1], chat("Describe Eve, 22.")],
        [
            greedy(None, 24),
            greedy(S(json=schema), 64),
            greedy(None, 24),
            greedy(S(json=schema), 64),
        ],
        use_tqdm=False,
    )
    assert mixed[0].outputs[0].token_ids == alone[0].outputs[0].token_ids
    assert mixed[2].outputs[0].token_ids == alone[1].outputs[0].token_ids
    for out in (mixed[1], mixed[3]):
        jsonschema.validate(json.loads(out.outputs[0].text), schema)


def test_regex_choice_and_grammar(llm):
    outs = llm.chat(
        [chat("Give a product code.")] * 3,
        [
            greedy(S(regex=r"[A-Z]{3}-[0-9]{4}"), 32),
            greedy(S(choice=["positive", "negative", "neutral"]), 32),
            greedy(S(grammar='root ::= "The answer is " ("yes" | "no") "."'), 32),
        ],
        use_tqdm=False,
    )
    assert re.fullmatch(r"[A-Z]{3}-[0-9]{4}", outs[0].outputs[0].text)
    assert outs[1].outputs[0].text in ("positive", "negative", "neutral")
    assert re.fullmatch(r"The answer is (yes|no)\.", outs[2].outputs[0].text)
    assert all(o.outputs[0].finish_reason == "stop" for o in outs)


def test_n_samples_each_follow_the_grammar(llm):
    schema = SCHEMA_CASES[4][2]  # bounded array of fruits
    out = llm.chat(
        chat("List some fruits."),
        SamplingParams(
            n=4, temperature=1.0, seed=7, max_tokens=96, structured_outputs=S(json=schema)
        ),
        use_tqdm=False,
    )[0]
    assert len(out.outputs) == 4
    for sample in out.outputs:
        jsonschema.validate(json.loads(sample.text), schema)


def test_preemption_keeps_outputs_identical(schema_runs):
    # 12 blocks of 16 tokens cannot hold 6 chats at once: requests are preempted and
    # recomputed, grammar state and forced tokens included. The reference: the same cases
    # in the roomy engine's jump-forward run.
    tight = LLM(dtype="float32", num_gpu_blocks_override=12, max_model_len=190)
    cases = SCHEMA_CASES[:6]
    prompts = [chat(p) for _, p, _ in cases]
    params = [greedy(S(json=s), 96) for _, _, s in cases]
    got = tight.chat(prompts, params, use_tqdm=False)
    want = schema_runs[True][0][:6]
    assert tight.engine.scheduler.num_preemptions > 0
    for (_, _, schema), g, w in zip(cases, got, want):
        assert g.outputs[0].token_ids == w.outputs[0].token_ids
        jsonschema.validate(json.loads(g.outputs[0].text), schema)


def test_grammar_end_stops_even_with_ignore_eos(llm):
    out = llm.chat(
        chat("Is water wet?"),
        greedy(S(choice=["yes", "no"]), 50, ignore_eos=True),
        use_tqdm=False,
    )[0].outputs[0]
    assert out.text in ("yes", "no")
    assert out.finish_reason == "stop"


def test_min_tokens_cannot_push_output_past_the_grammar(llm):
    out = llm.chat(
        chat("Is water wet?"), greedy(S(choice=["yes", "no"]), 50, min_tokens=10), use_tqdm=False
    )
    assert out[0].outputs[0].text in ("yes", "no")


def test_max_tokens_cuts_a_constrained_output_with_length(llm):
    out = llm.chat(chat("Describe Alice."), greedy(S(json=SCHEMA_CASES[0][2]), 3), use_tqdm=False)
    sample = out[0].outputs[0]
    assert sample.finish_reason == "length"
    assert len(sample.token_ids) == 3


def test_bad_schema_raises_and_queues_nothing(llm):
    with pytest.raises(ValueError, match="Unsupported type"):
        llm.generate(["x", "y"], [greedy(), greedy(S(json={"type": "foo"}))], use_tqdm=False)
    assert not llm.engine.has_unfinished_requests()


def test_a_slow_compile_delays_only_its_own_request(llm, monkeypatch):
    manager = llm.engine.grammars
    release = threading.Event()
    real = manager._compile

    def slow(params):
        release.wait(30)
        return real(params)

    monkeypatch.setattr(manager, "_compile", slow)
    tok = llm.tokenizer.encode("Hello")
    slow_schema = S(json={"type": "object", "properties": {"slow": {"type": "integer"}}})
    llm.engine.add_request("slow", tok, greedy(slow_schema, 8))
    llm.engine.add_request("free", tok, greedy(None, 4))
    finished = set()
    for _ in range(10):
        for up in llm.engine.step():
            if up.finished:
                finished.add(up.request_id)
    assert finished == {"free"}  # done while the other's grammar is still compiling
    assert llm.engine.grammars.is_waiting("slow")
    release.set()
    while llm.engine.has_unfinished_requests():
        for up in llm.engine.step():
            if up.finished:
                finished.add(up.request_id)
    assert finished == {"free", "slow"}


def test_abort_while_compiling(llm, monkeypatch):
    manager = llm.engine.grammars
    release = threading.Event()
    real = manager._compile
    monkeypatch.setattr(manager, "_compile", lambda p: (release.wait(30), real(p))[1])
    tok = llm.tokenizer.encode("Hello")
    llm.engine.add_request("gone", tok, greedy(S(json={"type": "object", "title": "gone"}), 8))
    llm.engine.abort(["gone"])
    assert not llm.engine.has_unfinished_requests()
    release.set()
    assert llm.engine.step() == []
    assert "gone" not in manager.matchers


@pytest.mark.parametrize("jump_forward", [True, False], ids=["jump", "no-jump"])
def test_schema_applies_after_the_thinking_and_a_budget_closes_it(llm, jump_forward):
    """The model thinks freely for its budget (4 tokens), the end marker is written by
    force, and the answer after it is the schema's (reasoning models, thinking_bounds)."""
    person = {
        "type": "object",
        "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
        "required": ["name", "age"],
    }
    end = llm.tokenizer.encode("</think>", add_special_tokens=False)
    so = S(json=person, thinking_end=end, max_thinking_tokens=4)
    llm.engine.config.structured.jump_forward = jump_forward
    try:
        out = llm.chat(chat("Who are you? Think first."), greedy(so, max_tokens=120))
    finally:
        llm.engine.config.structured.jump_forward = True
    out = out[0].outputs[0]
    assert out.token_ids[4 : 4 + len(end)] == end
    thinking, sep, answer = out.text.partition("</think>")
    assert sep and thinking  # (the free part: whatever the model thought)
    jsonschema.validate(json.loads(answer), person)
    assert out.finish_reason == "stop"


def test_unique_items_are_kept_unique_as_they_are_written(llm):
    """uniqueItems has no grammar: a repeat is refused where its item would complete, and
    the model writes another item instead."""
    schema = {
        "type": "array",
        "items": {"enum": ["red", "green", "blue", "black"]},
        "uniqueItems": True,
        "minItems": 4,
        "maxItems": 4,
    }
    out = llm.chat(chat("List colours."), greedy(S(json=schema), max_tokens=40))[0].outputs[0]
    items = json.loads(out.text)
    assert out.finish_reason == "stop" and sorted(items) == ["black", "blue", "green", "red"]


def test_an_impossible_schema_is_never_a_success(llm):
    """Two unique items that must both be "a": the grammar leads into a dead end; the
    request ends there, not passed off as a success (finish_reason "error")."""
    schema = {"type": "array", "items": {"const": "a"}, "uniqueItems": True, "minItems": 2}
    out = llm.chat(chat("Say a twice."), greedy(S(json=schema), max_tokens=20))[0].outputs[0]
    assert out.text.startswith('["a", "a') and out.finish_reason == "error"


def test_strict_refuses_what_no_grammar_enforces(llm):
    schema = {"type": "array", "items": {"type": "string"}, "uniqueItems": True}
    with pytest.raises(ValueError, match="strict"):
        llm.generate(["x"], greedy(S(json=schema, strict=True)))
