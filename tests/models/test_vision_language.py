"""Each vision-language family (LLaVA, LLaVA-NeXT, LLaVA-OneVision, Qwen2-VL, Qwen2.5-VL,
Idefics3: SmolVLM's layout and classes, Gemma 3: images attended both ways), built tiny by transformers with its image
processor: greedy tokens equal transformers' in float32 with one image, two (apart and
adjacent), images of other sizes (other token counts: Qwen's M-RoPE positions and windows,
Idefics3's tile grids, the anyres LLaVAs' kept grids, shrunk ones, OneVision's overviews
alone when a prompt has several) and no image, in one mixed batch under chunked prefill
and preemption; a repeated image hits the prefix cache (hash and radix) and is not encoded
again, while another image behind the same text never hits; LLM.chat takes OpenAI content
parts."""

from __future__ import annotations

import pytest
from vision_helpers import (
    IMAGE_TOKEN_ID,
    PLACEHOLDERS,
    data_url,
    hf_greedy_with_images,
    hf_vision_model,
    random_image,
)

from cadence import LLM, SamplingParams

NEW_TOKENS = 8
ROLE = "<|im_start|>user\n{}<|im_end|>\n<|im_start|>assistant\n"
# (prompt text, images): "<image>" stands for the family's placeholder
CASES = [
    ("what is in <image> here?", [(40, 50, 1)]),
    ("compare <image> with <image> please", [(32, 32, 2), (90, 20, 3)]),
    ("<image><image> adjacent", [(64, 64, 4), (33, 70, 5)]),
    ("no image at all, a longer text prompt", []),
    ("a wide one <image>", [(300, 17, 6)]),
]
KINDS = ["llava", "llava_next", "llava_onevision", "qwen2_vl", "qwen2_5_vl", "idefics3", "gemma3"]


@pytest.fixture(scope="module", params=KINDS)
def vlm(request, tiny_vision_model_dir):
    """(kind, path, transformers' model, its processor)"""
    path = tiny_vision_model_dir(request.param)
    return (request.param, path, *hf_vision_model(request.param, path))


def _prompt(kind: str, text: str) -> str:
    return ROLE.format(text.replace("<image>", PLACEHOLDERS[kind]))


def _requests(kind: str):
    return [
        {
            "prompt": _prompt(kind, text),
            "multi_modal_data": {"image": [random_image(*s) for s in sizes]},
        }
        for text, sizes in CASES
    ]


def _expected(vlm):
    kind, _, hf, processor = vlm
    return [
        hf_greedy_with_images(
            hf, processor, r["prompt"], r["multi_modal_data"]["image"], NEW_TOKENS
        )
        for r in _requests(kind)
    ]


PARAMS = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True)


@pytest.mark.parametrize("prefix_cache", ["hash", "radix"])
def test_greedy_equals_transformers_chunked_preempted_and_cached(vlm, prefix_cache):
    kind, path, _, _ = vlm
    expected = _expected(vlm)
    # A 16-token budget splits the images' placeholders across steps beside decodes; a
    # pool that holds the longest request alone, but not all five at full length, preempts.
    # (Gemma 3's pool is shared by two KV groups: its sliding layers' and the others'.)
    longest = max(len(ids) for ids, _ in expected) + NEW_TOKENS
    groups = 2 if kind == "gemma3" else 1
    llm = LLM(
        path,
        dtype="float32",
        block_size=4,
        max_num_batched_tokens=16,
        num_gpu_blocks_override=(-(-longest // 4) + 2) * groups,
        prefix_cache=prefix_cache,
        check_kv_integrity=True,
    )
    got = llm.generate(_requests(kind), PARAMS, use_tqdm=False)
    assert llm.engine.scheduler.num_preemptions > 0
    assert [o.prompt_token_ids for o in got] == [ids for ids, _ in expected]
    assert [o.outputs[0].token_ids for o in got] == [tokens for _, tokens in expected]
    # On a pool that keeps them: the same images again find their prompts cached (but the
    # last, partial block), and are not encoded again.
    llm = LLM(path, dtype="float32", block_size=4, prefix_cache=prefix_cache)
    llm.generate(_requests(kind), PARAMS, use_tqdm=False)
    feeder = llm.engine.runner.driver.images
    encoded = feeder.num_encoded
    again = llm.generate(_requests(kind), PARAMS, use_tqdm=False)
    for out, (ids, tokens) in zip(again, expected):
        assert out.num_cached_tokens >= len(ids) - 4
        assert out.outputs[0].token_ids == tokens
    assert feeder.num_encoded == encoded


def _one(llm, kind: str, text: str, image):
    request = {"prompt": _prompt(kind, text), "multi_modal_data": {"image": image}}
    return llm.generate(request, PARAMS, use_tqdm=False)[0]


def test_another_image_behind_the_same_text_never_hits(vlm):
    kind, path, hf, processor = vlm
    llm = LLM(path, dtype="float32", block_size=4, num_gpu_blocks_override=64)
    text = "describe <image> in a few words, please"
    first = _one(llm, kind, text, random_image(40, 40, 7))
    other = random_image(40, 40, 8)
    second = _one(llm, kind, text, other)
    assert second.num_cached_tokens <= second.prompt_token_ids.index(IMAGE_TOKEN_ID)
    _, tokens = hf_greedy_with_images(hf, processor, _prompt(kind, text), [other], NEW_TOKENS)
    assert second.outputs[0].token_ids == tokens
    assert first.outputs[0].token_ids != tokens  # (the image shows in the output)


def test_a_repeated_image_is_encoded_once(vlm):
    kind, path, _, _ = vlm
    # No prefix cache, and steps of 16 tokens: each request reaches the image in its own
    # steps, and finds it in the encoder's cache.
    llm = LLM(path, dtype="float32", max_num_batched_tokens=16, enable_prefix_caching=False)
    feeder = llm.engine.runner.driver.images
    image = random_image(50, 50, 9)
    outs = [_one(llm, kind, "question 0: <image>?", image)]
    encoded = feeder.num_encoded  # 1 (Idefics3: the image's tiles and overview)
    outs += [_one(llm, kind, f"question {i}: <image>?", image) for i in (1, 2)]
    assert feeder.num_encoded == encoded and feeder.num_reused >= 2 * encoded
    assert all(o.num_cached_tokens == 0 for o in outs)


def test_chat_takes_content_parts(vlm):
    kind, path, hf, processor = vlm
    llm = LLM(path, dtype="float32")
    image = random_image(45, 45, 10)
    _, tokens = hf_greedy_with_images(
        hf, processor, _prompt(kind, "what is <image>"), [image], NEW_TOKENS
    )
    for part in (
        {"type": "image_url", "image_url": {"url": data_url(image)}},
        {"type": "image", "image": image},
    ):
        messages = [{"role": "user", "content": [{"type": "text", "text": "what is "}, part]}]
        out = llm.chat(messages, PARAMS, use_tqdm=False)[0]
        assert out.outputs[0].token_ids == tokens


def test_bad_image_requests_raise_and_add_nothing(tiny_vision_model_dir):
    llm = LLM(tiny_vision_model_dir("llava"), dtype="float32", limit_mm_per_prompt={"image": 2})
    image = random_image(20, 20, 11)
    text = ROLE.format("<image>")
    with pytest.raises(ValueError, match="names 1 images .* but 2 were sent"):
        llm.generate({"prompt": text, "multi_modal_data": {"image": [image, image]}}, PARAMS)
    with pytest.raises(ValueError, match="at most 2"):
        llm.generate({"prompt": text * 3, "multi_modal_data": {"image": [image] * 3}}, PARAMS)
    with pytest.raises(ValueError, match="must be a URL or a PIL image"):
        llm.generate({"prompt": text, "multi_modal_data": {"image": 42}}, PARAMS)
    with pytest.raises(ValueError, match="image tokens"):  # placeholders without images
        llm.generate({"prompt_token_ids": [1, 2, IMAGE_TOKEN_ID, 3]}, PARAMS)
    assert not llm.engine.scheduler.requests


def test_an_image_the_processor_refuses_is_a_clear_error(tiny_vision_model_dir):
    llm = LLM(tiny_vision_model_dir("qwen2_vl"), dtype="float32")
    request = {
        "prompt": _prompt("qwen2_vl", "<image>"),
        "multi_modal_data": {"image": random_image(1, 900, 12)},  # 900:1
    }
    with pytest.raises(ValueError, match="image processor refused the image: .*aspect ratio"):
        llm.generate(request, PARAMS)


def test_a_bf16_engine_gets_bf16_pixels_and_the_same_tokens(tiny_vision_model_dir):
    """The API side sends pixels in the model's dtype (half float32's bytes): the encoder
    sees exactly what casting float32 pixels in the engine gave."""
    path = tiny_vision_model_dir("qwen2_vl")
    request = {
        "prompt": _prompt("qwen2_vl", "what is <image>?"),
        "multi_modal_data": {"image": random_image(40, 36, 13)},
    }
    llm = LLM(path, dtype="bfloat16", enable_prefix_caching=False)
    assert llm.images.prompts.pixel_dtype == "bfloat16"
    halves = llm.generate(request, PARAMS, use_tqdm=False)[0].outputs[0].token_ids
    llm.images.prompts.pixel_dtype = "float32"  # as before: cast in the engine
    llm.engine.runner.driver.images.cache.clear()
    llm.engine.runner.driver.images.cached_rows = 0
    assert llm.generate(request, PARAMS, use_tqdm=False)[0].outputs[0].token_ids == halves


def test_an_image_attended_both_ways_must_fit_one_step(tiny_vision_model_dir):
    """Gemma 3 prefills each image (9 tokens here) in one step: a budget of 8 refuses it
    clearly rather than splitting it or waiting for ever."""
    llm = LLM(tiny_vision_model_dir("gemma3"), dtype="float32", max_num_batched_tokens=8)
    request = {
        "prompt": _prompt("gemma3", "what is <image>?"),
        "multi_modal_data": {"image": random_image(30, 30, 14)},
    }
    with pytest.raises(ValueError, match="an image of 9 tokens, which this model prefills in one"):
        llm.generate(request, PARAMS)
    assert not llm.engine.scheduler.requests
