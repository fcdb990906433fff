"""LLaVA, built tiny by transformers with its processor: greedy tokens equal transformers'
in float32 with one image, two (apart and adjacent), images of other sizes and no image,
in one mixed batch under chunked prefill and preemption; a repeated image hits the prefix
cache (hash and radix) and is not re-encoded, while another image behind the same text
never hits; LLM.chat takes OpenAI content parts."""

from __future__ import annotations

import pytest
import torch
from vision_helpers import data_url, hf_greedy_with_images, random_image

from cadence import LLM, SamplingParams

NEW_TOKENS = 8
ROLE = "<|im_start|>user\n{}<|im_end|>\n<|im_start|>assistant\n"
# (prompt text, images): the placeholder names each image where it goes
CASES = [
    (ROLE.format("what is in <image> here?"), [(40, 50, 1)]),
    (ROLE.format("compare <image> with <image> please"), [(32, 32, 2), (90, 20, 3)]),
    (ROLE.format("<image><image> adjacent"), [(64, 64, 4), (33, 70, 5)]),
    (ROLE.format("no image at all, a longer text prompt"), []),
    (ROLE.format("a wide one <image>"), [(300, 17, 6)]),
]


@pytest.fixture(scope="module")
def llava(tiny_vision_model_dir):
    import transformers as tf

    path = tiny_vision_model_dir("llava")
    hf = tf.LlavaForConditionalGeneration.from_pretrained(
        path, dtype=torch.float32, attn_implementation="eager"
    ).eval()
    return path, hf, tf.AutoProcessor.from_pretrained(path)


def _requests():
    return [
        {"prompt": text, "multi_modal_data": {"image": [random_image(*s) for s in sizes]}}
        for text, sizes in CASES
    ]


def _expected(llava):
    _, hf, processor = llava
    return [
        hf_greedy_with_images(
            hf, processor, r["prompt"], r["multi_modal_data"]["image"], NEW_TOKENS
        )
        for r in _requests()
    ]


PARAMS = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True)


@pytest.mark.parametrize("prefix_cache", ["hash", "radix"])
def test_greedy_equals_transformers_chunked_preempted_and_cached(llava, prefix_cache):
    path, _, _ = llava
    expected = _expected(llava)
    # A 16-token budget splits every image's 16 placeholders across steps beside decodes;
    # 20 blocks of 4 tokens cannot hold all five requests at full length: some preempt.
    llm = LLM(
        path,
        dtype="float32",
        block_size=4,
        max_num_batched_tokens=16,
        num_gpu_blocks_override=20,
        prefix_cache=prefix_cache,
        check_kv_integrity=True,
    )
    got = llm.generate(_requests(), PARAMS, use_tqdm=False)
    assert llm.engine.scheduler.num_preemptions > 0
    assert [o.prompt_token_ids for o in got] == [ids for ids, _ in expected]
    assert [o.outputs[0].token_ids for o in got] == [tokens for _, tokens in expected]
    # On a pool that keeps them: the same images again find their prompts cached (but the
    # last, partial block), and are not encoded again.
    llm = LLM(path, dtype="float32", block_size=4, prefix_cache=prefix_cache)
    llm.generate(_requests(), PARAMS, use_tqdm=False)
    feeder = llm.engine.runner.driver.images
    encoded = feeder.num_encoded
    again = llm.generate(_requests(), PARAMS, use_tqdm=False)
    for out, (ids, tokens) in zip(again, expected):
        assert out.num_cached_tokens >= len(ids) - 4
        assert out.outputs[0].token_ids == tokens
    assert feeder.num_encoded == encoded


def test_another_image_behind_the_same_text_never_hits(llava):
    path, hf, processor = llava
    llm = LLM(path, dtype="float32", block_size=4, num_gpu_blocks_override=64)
    text = ROLE.format("describe <image> in a few words, please")
    first = llm.generate(
        {"prompt": text, "multi_modal_data": {"image": random_image(40, 40, 7)}},
        PARAMS,
        use_tqdm=False,
    )[0]
    other = random_image(40, 40, 8)
    second = llm.generate(
        {"prompt": text, "multi_modal_data": {"image": other}}, PARAMS, use_tqdm=False
    )[0]
    image_start = second.prompt_token_ids.index(processor.image_token_id)
    assert second.num_cached_tokens <= image_start  # the text before the image only
    _, tokens = hf_greedy_with_images(hf, processor, text, [other], NEW_TOKENS)
    assert second.outputs[0].token_ids == tokens
    assert first.outputs[0].token_ids != tokens  # (the image shows in the output)


def test_a_repeated_image_is_encoded_once(llava):
    path, _, _ = llava
    # No prefix cache, and steps of 16 tokens: each request reaches the image in its own
    # steps, and finds it in the encoder's cache.
    llm = LLM(path, dtype="float32", max_num_batched_tokens=16, enable_prefix_caching=False)
    feeder = llm.engine.runner.driver.images
    image = random_image(50, 50, 9)
    requests = [
        {"prompt": ROLE.format(f"question {i}: <image>?"), "multi_modal_data": {"image": image}}
        for i in range(3)
    ]
    outs = llm.generate(requests, PARAMS, use_tqdm=False)
    assert feeder.num_encoded == 1 and feeder.num_reused >= 2
    assert all(o.num_cached_tokens == 0 for o in outs)


def test_chat_takes_content_parts(llava):
    path, hf, processor = llava
    llm = LLM(path, dtype="float32")
    image = random_image(45, 45, 10)
    messages = [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "what is "},
                {"type": "image_url", "image_url": {"url": data_url(image)}},
            ],
        }
    ]
    out = llm.chat(messages, PARAMS, use_tqdm=False)[0]
    text = ROLE.format("what is <image>")
    ids, tokens = hf_greedy_with_images(hf, processor, text, [image], NEW_TOKENS)
    assert out.prompt_token_ids == ids
    assert out.outputs[0].token_ids == tokens
    pil = llm.chat(
        [
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "what is "},
                    {"type": "image", "image": image},
                ],
            }
        ],
        PARAMS,
        use_tqdm=False,
    )[0]
    assert pil.outputs[0].token_ids == tokens


def test_bad_image_requests_raise_and_add_nothing(llava):
    path, _, _ = llava
    llm = LLM(path, dtype="float32", limit_mm_per_prompt={"image": 2})
    image = random_image(20, 20, 11)
    text = ROLE.format("<image>")
    with pytest.raises(ValueError, match="names 1 images .* but 2 were sent"):
        llm.generate({"prompt": text, "multi_modal_data": {"image": [image, image]}}, PARAMS)
    with pytest.raises(ValueError, match="at most 2"):
        llm.generate({"prompt": text * 3, "multi_modal_data": {"image": [image] * 3}}, PARAMS)
    with pytest.raises(ValueError, match="not a URL or a PIL image|must be a URL"):
        llm.generate({"prompt": text, "multi_modal_data": {"image": 42}}, PARAMS)
    with pytest.raises(ValueError, match="image tokens"):  # placeholders without images
        llm.generate({"prompt_token_ids": [1, 2, 49152, 3]}, PARAMS)
    assert not llm.engine.scheduler.requests
