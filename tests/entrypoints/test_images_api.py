"""Images over HTTP (a tiny LLaVA served): OpenAI content parts with data: URLs give
transformers' greedy tokens, streamed or not, one image or two across turns; /tokenize
counts the placeholders; bad images, too many images, URLs of hosts not allowed and image
tokens sent without images are 400 error objects."""

from __future__ import annotations

import httpx
import pytest
from server_helper import Server
from vision_helpers import IMAGE_TOKEN_ID, data_url, hf_greedy_with_images, random_image

pytestmark = pytest.mark.slow  # starts a server of its own (make test-fast skips it)

NEW_TOKENS = 8
GREEDY = {"temperature": 0.0, "max_tokens": NEW_TOKENS, "extra_body": {"ignore_eos": True}}


@pytest.fixture(scope="module")
def served(tiny_vision_model_dir):
    path = tiny_vision_model_dir("llava")
    srv = Server(
        [path, "--dtype", "float32", "--limit-mm-per-prompt", '{"image": 2}']
        + ["--served-model-name", "m"]
    )
    try:
        srv.wait_ready()
        yield path, srv
    finally:
        srv.stop()


@pytest.fixture(scope="module")
def oracle(served):
    import torch
    import transformers as tf

    path, _ = served
    hf = tf.LlavaForConditionalGeneration.from_pretrained(
        path, dtype=torch.float32, attn_implementation="eager"
    ).eval()
    processor = tf.AutoProcessor.from_pretrained(path)

    def expect(text: str, images: list) -> str:
        _, tokens = hf_greedy_with_images(hf, processor, text, images, NEW_TOKENS)
        return processor.tokenizer.decode(tokens, skip_special_tokens=True)

    return expect


def _part(image):
    return {"type": "image_url", "image_url": {"url": data_url(image)}}


def test_chat_with_images_equals_transformers_streamed_or_not(served, oracle):
    from openai import OpenAI

    _, srv = served
    client = OpenAI(base_url=srv.url + "/v1", api_key="none", max_retries=0)
    first, second = random_image(40, 50, 1), random_image(70, 30, 2)
    messages = [
        {"role": "user", "content": [{"type": "text", "text": "what is "}, _part(first)]},
        {"role": "assistant", "content": "a picture"},
        {"role": "user", "content": [_part(second), {"type": "text", "text": " and this?"}]},
    ]
    text = (
        "<|im_start|>user\nwhat is <image><|im_end|>\n<|im_start|>assistant\na picture"
        "<|im_end|>\n<|im_start|>user\n<image> and this?<|im_end|>\n<|im_start|>assistant\n"
    )
    expected = oracle(text, [first, second])
    r = client.chat.completions.create(model="m", messages=messages, **GREEDY)
    assert r.choices[0].message.content == expected
    assert r.usage.prompt_tokens > 2 * 16  # (each image's 16 placeholders count)
    stream = client.chat.completions.create(model="m", messages=messages, stream=True, **GREEDY)
    assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == expected
    one = [{"role": "user", "content": [_part(first)]}]
    r = client.chat.completions.create(model="m", messages=one, **GREEDY)
    assert r.choices[0].message.content == oracle(
        "<|im_start|>user\n<image><|im_end|>\n<|im_start|>assistant\n", [first]
    )


def test_metrics_and_the_step_timeline_show_the_encoder(served):
    from server_helper import metric

    _, srv = served
    http = httpx.Client(base_url=srv.url)
    before = metric(http, "cadence:images_encoded_total")
    content = [_part(random_image(12, 12, 20)), {"type": "text", "text": "hi"}]
    body = {"messages": [{"role": "user", "content": content}], "max_tokens": 2}
    for _ in range(2):  # the second finds the image's prompt (and features) cached
        assert http.post("/v1/chat/completions", json=body).status_code == 200
    assert metric(http, "cadence:images_encoded_total") == before + 1
    assert metric(http, "cadence:image_tokens_total") >= 16
    steps = http.get("/v1/engine/steps").json()["steps"]
    assert any(s["image_tokens"] == 16 and s["encode_ms"] > 0 for s in steps)


def test_responses_and_messages_take_images_as_chat_does(served, oracle):
    import anthropic
    from openai import OpenAI

    _, srv = served
    image = random_image(36, 28, 21)
    url = data_url(image)
    expected = oracle("<|im_start|>user\nname <image><|im_end|>\n<|im_start|>assistant\n", [image])
    client = OpenAI(base_url=srv.url + "/v1", api_key="none", max_retries=0)
    content = [{"type": "input_text", "text": "name "}, {"type": "input_image", "image_url": url}]
    r = client.responses.create(
        model="m",
        input=[{"role": "user", "content": content}],
        max_output_tokens=NEW_TOKENS,
        temperature=0.0,
        extra_body={"ignore_eos": True},
    )
    assert r.output_text == expected
    claude = anthropic.Anthropic(base_url=srv.url, api_key="none", max_retries=0)
    source = {"type": "base64", "media_type": "image/png", "data": url.split(",", 1)[1]}
    msg = claude.messages.create(
        model="m",
        max_tokens=NEW_TOKENS,
        messages=[
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "name "},
                    {"type": "image", "source": source},
                ],
            }
        ],
        extra_body={"ignore_eos": True, "temperature": 0.0},  # (the SDK no longer types it)
    )
    assert msg.content[0].text == expected


def test_bench_serve_sends_random_images(served, tmp_path):
    """`cadence bench serve --random-images`: every request carries its images and succeeds;
    the server encoded each (distinct) image once."""
    import json

    from server_helper import metric

    from cadence.cli.main import main

    _, srv = served
    http = httpx.Client(base_url=srv.url)
    before = metric(http, "cadence:images_encoded_total")
    out = tmp_path / "bench.json"
    flags = ["--base-url", srv.url, "--endpoint", "chat", "--random-images", "2"]
    flags += ["--random-image-size", "48x40", "--num-prompts", "3", "--random-input-len", "8"]
    flags += ["--random-output-len", "2", "--num-warmups", "0"]
    assert main(["bench", "serve", "--disable-tqdm", *flags, "--save-json", str(out)]) == 0
    summary = json.loads(out.read_text())
    assert summary["dataset"]["images"] == 2
    assert metric(http, "cadence:images_encoded_total") == before + 6


def test_tokenize_expands_each_image(served):
    _, srv = served
    content = [{"type": "text", "text": "hi "}, _part(random_image(10, 10, 3))]
    r = httpx.post(srv.url + "/tokenize", json={"messages": [{"role": "user", "content": content}]})
    assert r.status_code == 200
    assert r.json()["tokens"].count(IMAGE_TOKEN_ID) == 16


@pytest.mark.parametrize(
    ("content", "why"),
    [
        ([{"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}], "decode"),
        ([{"type": "image_url", "image_url": {"url": "https://example.com/a.png"}}], "fetch"),
        ([{"type": "image_url", "image_url": {"url": "file:///etc/passwd"}}], "scheme"),
        ([_part(random_image(8, 8, 4))] * 3, "at most 2"),
        ([{"type": "input_audio", "input_audio": {"data": "", "format": "wav"}}], "tag"),
    ],
)
def test_bad_images_are_400_error_objects(served, content, why):
    _, srv = served
    r = httpx.post(
        srv.url + "/v1/chat/completions",
        json={"messages": [{"role": "user", "content": content}], "max_tokens": 2},
    )
    assert r.status_code == 400, r.text
    assert why in r.json()["error"]["message"]


def test_image_tokens_without_images_are_refused(served):
    """A client cannot smuggle placeholder tokens (embedding rows no image fills) in."""
    _, srv = served
    r = httpx.post(
        srv.url + "/v1/completions",
        json={"prompt": [1, 2, IMAGE_TOKEN_ID, 3], "max_tokens": 2},
    )
    assert r.status_code == 400
    assert "image tokens" in r.json()["error"]["message"]
    assert httpx.get(srv.url + "/health").status_code == 200


def test_the_web_chat_attaches_an_image(served, tmp_path):
    """The web UI offers the picker for a model that takes images, shows the preview, and
    sends the image as the API's content parts: its answer is the API's for them."""
    from browser_helper import browser_page, wait_until

    _, srv = served
    image = random_image(30, 30, 22)
    image.save(tmp_path / "cat.png")
    body = {
        "model": "m",
        "messages": [
            {"role": "user", "content": [_part(image), {"type": "text", "text": "what?"}]}
        ],
        "max_tokens": NEW_TOKENS,
        "temperature": 0.0,
    }
    expected = httpx.post(srv.url + "/v1/chat/completions", json=body).json()
    with browser_page(srv.url + "/") as page:
        wait_until(page, lambda: page.is_visible("#attach"), what="the image button")
        page.fill("#temperature", "0")
        page.fill("#max-tokens", str(NEW_TOKENS))
        page.set_input_files("#image-file", str(tmp_path / "cat.png"))
        wait_until(page, lambda: page.query_selector("#attachments img"), what="the preview")
        page.fill("#chat-input", "what?")
        page.press("#chat-input", "Enter")
        page.wait_for_selector(".msg.assistant .meta", timeout=60_000)
        assert page.query_selector(".msg.user .images img") is not None
        assert page.is_hidden("#attachments")
        answer = page.inner_text(".msg.assistant .content")
        assert answer.strip() == expected["choices"][0]["message"]["content"].strip()
        assert not page.errors
