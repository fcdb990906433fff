"""Whole spans: an image whose tokens attend to each other both ways (Gemma 3) is prefilled
in one step. A prefill chunk never ends inside one: it stops before the image, or takes the
whole image when the step's budget allows, else waits; the outputs are what chunking
anywhere would give."""

from __future__ import annotations

from scheduler_helpers import (
    BS,
    check_all_free,
    expected_output,
    fake_token,
    make_requests,
    make_scheduler,
    run_to_completion,
    step,
)

from cadence.core.hash_prefix_cache import make_block_hasher
from cadence.core.request import Request
from cadence.multimodal.inputs import ImageInput
from cadence.sampling_params import SamplingParams


def image_request(rid: str, prompt_len: int, spans: list[tuple[int, int]], max_tokens=3):
    images = [ImageInput(f"{lo:064x}", lo, hi - lo, {}) for lo, hi in spans]
    return Request(
        rid,
        [1000 + k for k in range(prompt_len)],
        SamplingParams(max_tokens=max_tokens),
        block_hasher=make_block_hasher(BS),
        images=images,
        whole_images=True,
    )


def test_fit_chunk_cuts_before_a_span_or_carries_through_it():
    req = image_request("a", 30, [(5, 14), (20, 26)])
    assert req.whole_spans == [(5, 14), (20, 26)]
    assert req.fit_chunk(0, 8, 100) == 5  # would end inside the first: stop before it
    assert req.fit_chunk(0, 14, 100) == 14  # ends where it ends
    assert req.fit_chunk(5, 4, 100) == 9  # starts at it: the whole image
    assert req.fit_chunk(5, 4, 8) == 0  # ... which does not fit: not this step
    assert req.fit_chunk(9, 2, 100) == 5  # starts inside (a prefix-cache hit): to its end
    assert req.fit_chunk(14, 8, 100) == 6  # the second, from text before it
    assert req.fit_chunk(26, 4, 100) == 4  # past the images: as asked
    assert req.fit_chunk(9, 0, 100) == 0  # no prompt budget left: nothing, even inside
    assert req.fit_chunk(9, -2, 100) <= 0  # (a budget an earlier image overdrew)
    plain = Request("b", [1] * 30, SamplingParams(max_tokens=3), images=[], whole_images=True)
    assert plain.fit_chunk(0, 8, 100) == 8
    causal = image_request("c", 30, [])
    causal.whole_spans = []  # a family whose images attend causally: chunks end anywhere
    assert causal.fit_chunk(0, 8, 100) == 8


def test_no_chunk_ends_inside_an_image_and_outputs_do_not_change():
    sched = make_scheduler(budget=8)
    spans = [(3, 10), (12, 19), (19, 23)]  # 7, 7 and 4 tokens; two adjacent
    req = image_request("img", 30, spans)
    sched.add_request(req)
    ends = []
    while sched.has_unfinished_requests():
        start = req.num_computed_tokens
        out, _ = step(sched)
        ends.append(start + out.num_scheduled_tokens.get("img", 0))
    for lo, hi in spans:
        assert not any(lo < end < hi for end in ends), ends
    assert ends[:5] == [3, 11, 19, 27, 30]  # (8 a step; the first stops before the image it cut)
    assert req.output_token_ids == expected_output(req)
    check_all_free(sched)


def test_an_image_carried_past_the_prefill_bound_leaves_none_for_the_next():
    """With --max-prefill-tokens-while-decoding 4, an image of 6 tokens still runs whole
    (an image may overdraw the bound), and the next prompt waits for the next step."""
    sched = make_scheduler(budget=16, prefill_cap=4)
    (decoder,) = make_requests(1, prompt_len=1, max_tokens=8, id_prefix="d")
    sched.add_request(decoder)
    step(sched)  # it decodes from now on: the bound applies
    a = image_request("a", 8, [(0, 6)], max_tokens=1)
    b = image_request("b", 8, [(0, 6)], max_tokens=1)
    sched.add_request(a)
    sched.add_request(b)
    out, _ = step(sched)
    assert out.num_scheduled_tokens.get("a") == 6 and "b" not in out.num_scheduled_tokens
    run_to_completion(sched)
    assert a.output_token_ids == expected_output(a) and b.output_token_ids == expected_output(b)
    check_all_free(sched)


def test_an_image_waits_for_a_step_with_room_beside_decodes():
    """Six decodes leave 2 of 8 tokens: the image (6 tokens) waits for their end rather
    than being split, and runs whole."""
    sched = make_scheduler(budget=8)
    for r in make_requests(6, prompt_len=1, max_tokens=4, id_prefix="d"):
        sched.add_request(r)
    step(sched)  # their one-token prompts
    req = image_request("img", 8, [(2, 8)], max_tokens=2)
    sched.add_request(req)
    out, _ = step(sched)
    assert out.num_scheduled_tokens.get("img") == 2  # the text before the image
    scheduled = []
    while req.num_computed_tokens < 8:
        out, _ = step(sched)
        scheduled.append(out.num_scheduled_tokens.get("img", 0))
    assert scheduled[-1] == 6 and set(scheduled[:-1]) <= {0}
    run_to_completion(sched)
    assert req.output_token_ids == [fake_token("img", 8), fake_token("img", 9)]
    check_all_free(sched)
