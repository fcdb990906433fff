"""Async scheduling (step N+1 scheduled and launched before step N's tokens are read back)
gives exactly the tokens of the synchronous loop: greedy float32 equal to transformers,
under every budget, cache and preemption setting, with stops, max_tokens, seeds, logprobs
and grammars."""

from __future__ import annotations

import json

import pytest
from model_helpers import hf_greedy, make_prompts

from cadence import LLM, SamplingParams
from cadence.sampling_params import StructuredOutputsParams

LENGTHS = [3, 9, 17, 31, 40, 5, 64, 23]
NEW_TOKENS = 32
PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 12}, "age": {"type": "integer"}},
    "required": ["name", "age"],
}


@pytest.fixture(scope="module")
def llama(tiny_model_dir, hf_model):
    path = tiny_model_dir("llama")
    prompts = make_prompts(512, LENGTHS, seed=1)
    return path, prompts, [hf_greedy(hf_model(path), p, NEW_TOKENS) for p in prompts]


def run(path, prompts, params, **kw) -> tuple[LLM, list]:
    kw.setdefault("num_gpu_blocks_override", 512)
    llm = LLM(path, dtype="float32", check_kv_integrity=True, **kw)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    return llm, outs


@pytest.mark.parametrize(
    "kw",
    [
        {},
        {"max_num_batched_tokens": 8},  # prefill chunks and decodes share steps
        {"num_gpu_blocks_override": 12},  # preemption with a token in flight
        {"prefix_cache": "radix"},
        {"enable_prefix_caching": False, "block_size": 7},
        {"max_num_batched_tokens": 16, "max_prefill_tokens_while_decoding": 3},
        {"max_num_batched_tokens": 16, "mixed_step_factor": 2.0},
    ],
    ids=["default", "budget-8", "preemption", "radix", "no-cache-bs7", "prefill-cap-3", "paced"],
)
def test_greedy_equals_transformers(llama, kw):
    path, prompts, expected = llama
    greedy = SamplingParams(temperature=0, max_tokens=NEW_TOKENS, ignore_eos=True)
    llm, outs = run(path, prompts, greedy, async_scheduling=True, **kw)
    assert [o.outputs[0].token_ids for o in outs] == expected
    if kw.get("num_gpu_blocks_override") == 12:
        assert llm.engine.scheduler.num_preemptions > 0
    if "mixed_step_factor" in kw:  # every step launched was timed when read back
        pacer = llm.engine.scheduler.pacer
        assert pacer.decode_s > 0 and not pacer._launches
    assert not llm.engine.has_unfinished_requests()


def test_stops_lengths_seeds_and_logprobs_equal_the_synchronous_loop(llama):
    path, prompts, expected = llama
    stop_at = expected[0][5]  # a token prompt 0 produces at its 6th step
    params = [
        SamplingParams(temperature=0, max_tokens=NEW_TOKENS, stop_token_ids=[stop_at]),
        SamplingParams(temperature=0, max_tokens=1),
        SamplingParams(temperature=0, max_tokens=2, logprobs=3),
        SamplingParams(temperature=0.9, seed=11, max_tokens=20, n=2),
        SamplingParams(temperature=1.0, top_p=0.8, seed=3, max_tokens=7, min_tokens=5),
        SamplingParams(temperature=0, max_tokens=12, repetition_penalty=1.3),
        SamplingParams(temperature=0, max_tokens=NEW_TOKENS, stop_token_ids=[stop_at]),
        SamplingParams(temperature=0, max_tokens=3),
    ]

    def tokens(outs):
        return [[(s.token_ids, s.finish_reason, s.logprobs) for s in o.outputs] for o in outs]

    _, sync = run(path, prompts, params)
    llm, overlapped = run(path, prompts, params, async_scheduling=True)
    assert tokens(overlapped) == tokens(sync)
    # Requests ended by stop tokens while their next step was in flight: nothing pending.
    assert not llm.engine.has_unfinished_requests()
    stopped = overlapped[0].outputs[0]
    assert stopped.finish_reason == "stop"
    assert stopped.token_ids.index(stop_at) == len(stopped.token_ids) - 1  # nothing past it


def test_grammars_see_every_token_before_the_next_mask():
    chats = [[{"role": "user", "content": f"Describe person {i} as JSON."}] for i in range(4)]
    params = SamplingParams(
        temperature=0, max_tokens=64, structured_outputs=StructuredOutputsParams(json=PERSON)
    )
    outs = {}
    for mode in (False, True):
        llm = LLM(dtype="float32", kv_cache_memory=64 * 2**20, async_scheduling=mode)
        llm.engine.config.structured.jump_forward = False  # async mode never jumps
        outs[mode] = [o.outputs[0].text for o in llm.chat(chats, params, use_tqdm=False)]
    assert outs[True] == outs[False]
    for text in outs[True]:
        assert set(json.loads(text)) == {"name", "age"}


def test_jump_forward_runs_synchronous_steps_and_keeps_its_outputs():
    """With async scheduling on, constrained requests that want jump-forward step the engine
    synchronously (the step in flight is read back first): same outputs and forced tokens
    as the synchronous loop, and free requests in the same batch unchanged."""
    chats = [[{"role": "user", "content": f"Describe person {i} as JSON."}] for i in range(3)]
    constrained = SamplingParams(
        temperature=0, max_tokens=48, structured_outputs=StructuredOutputsParams(json=PERSON)
    )
    free = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    outs, forced = {}, {}
    for mode in (False, True):
        llm = LLM(dtype="float32", kv_cache_memory=64 * 2**20, async_scheduling=mode)
        prompts = [{"prompt_token_ids": llm.apply_chat_template(c)} for c in chats]
        params = [constrained] * len(chats) + [free]
        prompts.append({"prompt_token_ids": prompts[0]["prompt_token_ids"][:20]})
        outs[mode] = [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]
        forced[mode] = llm.engine.grammars.stats.jump_forward_tokens
    assert outs[True] == outs[False]
    assert forced[True] == forced[False] > 0


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_an_id_reused_right_after_a_stop_gets_only_its_own_tokens(
    async_scheduling, tiny_model_dir, hf_model
):
    """Request "a" stops while the next step (which still includes it) is in flight; a new
    request "a" added at once must not receive that step's token."""
    path = tiny_model_dir("llama")
    first, second = make_prompts(512, [9, 13], seed=3)
    hf = hf_model(path)
    stop_at = hf_greedy(hf, first, 8)[3]
    llm = LLM(path, dtype="float32", num_gpu_blocks_override=64, async_scheduling=async_scheduling)
    engine = llm.engine
    stop = SamplingParams(temperature=0, max_tokens=8, stop_token_ids=[stop_at])
    engine.add_request("a", first, stop)
    while not any(u.request_id == "a" and u.finished for u in engine.step()):
        pass
    engine.add_request("a", second, SamplingParams(temperature=0, max_tokens=6, ignore_eos=True))
    tokens = []
    while engine.has_unfinished_requests():
        tokens += [t for u in engine.step() for t in u.new_token_ids]
    assert tokens == hf_greedy(hf, second, 6)
