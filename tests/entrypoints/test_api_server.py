"""The OpenAI-compatible server, spoken to with the official `openai` client and httpx."""

from __future__ import annotations

import re

import httpx
import openai
import pytest
from server_helper import API_KEY, metric

GREEDY = dict(temperature=0, max_tokens=12)


# ---- endpoints ----------------------------------------------------------------------------


def test_models_health_version(http, model_name):
    models = http.get("/v1/models").json()
    assert models["object"] == "list" and models["data"][0]["id"] == model_name
    assert http.get("/health").status_code == 200
    version = http.get("/version").json()
    assert (
        version["version"]
        and version["prefix_cache"] == "hash"
        and version["scheduling_policy"] == "fcfs"
    )


def test_completion_basic_and_usage(client, model_name, http):
    r = client.completions.create(model=model_name, prompt="The capital of France is", **GREEDY)
    assert r.object == "text_completion" and len(r.choices) == 1
    assert r.choices[0].finish_reason in ("stop", "length")
    ids = http.post("/tokenize", json={"prompt": "The capital of France is"}).json()["tokens"]
    assert r.usage.prompt_tokens == len(ids)
    out_ids = http.post(
        "/tokenize", json={"prompt": r.choices[0].text, "add_special_tokens": False}
    ).json()
    assert r.usage.completion_tokens >= 1
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    assert out_ids["count"] >= 1


def test_prompt_forms_string_list_ids_and_id_lists(client, model_name, http):
    ids = http.post("/tokenize", json={"prompt": "Hello there"}).json()["tokens"]
    text = (
        client.completions.create(model=model_name, prompt="Hello there", **GREEDY).choices[0].text
    )
    as_ids = client.completions.create(model=model_name, prompt=ids, **GREEDY).choices[0].text
    assert as_ids == text
    many = client.completions.create(
        model=model_name, prompt=["Hello there", "One two three"], **GREEDY
    )
    assert [c.index for c in many.choices] == [0, 1] and many.choices[0].text == text
    id_lists = client.completions.create(model=model_name, prompt=[ids, ids], **GREEDY)
    assert [c.text for c in id_lists.choices] == [text, text]


def test_streamed_prompt_list_interleaves_and_equals_non_streamed(client, model_name):
    prompts = ["Hello there", "One two three", "The sky is"]
    whole = client.completions.create(model=model_name, prompt=prompts, **GREEDY)
    texts, order, usage = {}, [], None
    for chunk in client.completions.create(
        model=model_name,
        prompt=prompts,
        stream=True,
        stream_options={"include_usage": True},
        **GREEDY,
    ):
        usage = chunk.usage or usage
        for c in chunk.choices:
            texts[c.index] = texts.get(c.index, "") + c.text
            order.append(c.index)
    assert [texts[i] for i in range(3)] == [c.text for c in whole.choices]
    # The prompts ran together: prompt 0 had not finished when prompt 1 first streamed.
    assert order.index(1) < len(order) - 1 - order[::-1].index(0)
    assert usage.completion_tokens == whole.usage.completion_tokens


def test_chat_basic(client, model_name):
    r = client.chat.completions.create(
        model=model_name,
        messages=[
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "What is 2+2?"},
            {"role": "assistant", "content": "4."},
            {"role": "user", "content": "And 3+3?"},
        ],
        **GREEDY,
    )
    assert r.object == "chat.completion"
    assert r.choices[0].message.role == "assistant" and r.choices[0].message.content
    assert r.usage.completion_tokens >= 1


def test_a_text_model_answers_images_with_a_400(http, model_name):
    png = "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAIAAACQd1PeAAAADElEQVR4nGP4z8AAAAMBAQDJ/pLvAAAAAElFTkSuQmCC"
    content = [{"type": "text", "text": "hi"}, {"type": "image_url", "image_url": {"url": png}}]
    r = http.post(
        "/v1/chat/completions",
        json={"model": model_name, "messages": [{"role": "user", "content": content}]},
    )
    assert r.status_code == 400
    assert r.json()["error"]["message"] == "this model does not take images"


def test_streaming_equals_non_streaming(client, model_name):
    for kind in ("completion", "chat"):
        if kind == "completion":
            full = client.completions.create(model=model_name, prompt="Once upon a time", **GREEDY)
            stream = client.completions.create(
                model=model_name,
                prompt="Once upon a time",
                stream=True,
                stream_options={"include_usage": True},
                **GREEDY,
            )
            chunks = list(stream)
            text = "".join(c.choices[0].text for c in chunks if c.choices)
            expected = full.choices[0].text
        else:
            msgs = [{"role": "user", "content": "Tell me about cats."}]
            full = client.chat.completions.create(model=model_name, messages=msgs, **GREEDY)
            stream = client.chat.completions.create(
                model=model_name,
                messages=msgs,
                stream=True,
                stream_options={"include_usage": True},
                **GREEDY,
            )
            chunks = list(stream)
            text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
            expected = full.choices[0].message.content
        assert text == expected
        assert (
            chunks[-1].usage is not None
            and chunks[-1].usage.completion_tokens == full.usage.completion_tokens
        )
        finals = [
            c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason
        ]
        assert finals == [full.choices[0].finish_reason]


def test_sse_wire_format_ends_with_done(http, model_name):
    with http.stream(
        "POST",
        "/v1/completions",
        json={"model": model_name, "prompt": "Hi", "max_tokens": 4, "stream": True},
    ) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        lines = [line for line in r.iter_lines() if line]
    assert lines[-1] == "data: [DONE]"
    assert all(line.startswith("data: ") for line in lines)


def test_sampling_parameters_are_accepted_and_work(client, model_name):
    common = dict(model=model_name, prompt="List some fruits:", max_tokens=8)
    extra = {"top_k": 40, "min_p": 0.05}
    seeded = [
        client.completions.create(**common, temperature=1.0, seed=42, top_p=0.9, extra_body=extra)
        .choices[0]
        .text
        for _ in range(2)
    ]
    assert seeded[0] == seeded[1]
    r = client.completions.create(**common, n=3, temperature=1.0, seed=1)
    assert sorted(c.index for c in r.choices) == [0, 1, 2]
    assert r.usage.completion_tokens >= 3
    r = client.completions.create(
        **common,
        presence_penalty=1.0,
        frequency_penalty=0.5,
        temperature=0,
        extra_body={"repetition_penalty": 1.3, "min_tokens": 5, "ignore_eos": True, "priority": 1},
    )
    assert r.usage.completion_tokens == 8
    r = client.completions.create(**common, temperature=0, logit_bias={"42": 100})
    assert r.usage.completion_tokens == 8  # token 42 forever
    r = client.completions.create(
        model=model_name, prompt="Count: 1, 2, 3,", max_tokens=30, temperature=0, stop=[" 5"]
    )
    assert " 5" not in r.choices[0].text and r.choices[0].finish_reason == "stop"
    r = client.completions.create(
        model=model_name,
        prompt="Hi",
        max_tokens=30,
        temperature=0,
        user="alice",
        extra_body={"max_tokens": 3},
    )
    assert r.usage.completion_tokens <= 3


def test_max_completion_tokens_and_finish_length(client, model_name):
    r = client.chat.completions.create(
        model=model_name,
        messages=[{"role": "user", "content": "Write a long story."}],
        max_completion_tokens=5,
        temperature=0,
    )
    assert r.usage.completion_tokens == 5 and r.choices[0].finish_reason == "length"


def test_logprobs_completions_and_chat(client, model_name):
    r = client.completions.create(
        model=model_name, prompt="The sky is", max_tokens=4, temperature=0, logprobs=3
    )
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 4
    assert all(len(t) == 3 for t in lp.top_logprobs) and all(x <= 0 for x in lp.token_logprobs)
    r = client.chat.completions.create(
        model=model_name,
        messages=[{"role": "user", "content": "Hi"}],
        max_tokens=4,
        temperature=0,
        logprobs=True,
        top_logprobs=2,
    )
    content = r.choices[0].logprobs.content
    assert len(content) == r.usage.completion_tokens
    assert all(len(c.top_logprobs) == 2 and c.logprob <= 0 for c in content)


def test_echo_prepends_prompt(client, model_name):
    r = client.completions.create(
        model=model_name, prompt="Roses are red,", max_tokens=5, temperature=0, echo=True
    )
    assert r.choices[0].text.startswith("Roses are red,")


def test_tokenize_detokenize_round_trip(http):
    toks = http.post("/tokenize", json={"prompt": "Hello world"}).json()
    assert toks["count"] == len(toks["tokens"]) and toks["max_model_len"] == 2048
    assert (
        http.post("/detokenize", json={"tokens": toks["tokens"]}).json()["prompt"] == "Hello world"
    )
    chat = http.post("/tokenize", json={"messages": [{"role": "user", "content": "Hi"}]}).json()
    assert chat["count"] > toks["count"]


def test_metrics_are_prometheus_with_cadence_prefix(http):
    text = http.get("/metrics").text
    for name in [
        "cadence:num_requests_running",
        "cadence:num_requests_waiting",
        "cadence:kv_cache_usage_perc",
        "cadence:prefix_cache_queries_total",
        "cadence:prefix_cache_hits_total",
        "cadence:num_preemptions_total",
        "cadence:prompt_tokens_total",
        "cadence:generation_tokens_total",
        "cadence:time_to_first_token_seconds_bucket",
        "cadence:inter_token_latency_seconds_bucket",
        "cadence:e2e_request_latency_seconds_bucket",
        "cadence:request_queue_time_seconds_bucket",
        "cadence:requests_rejected_total",
    ]:
        assert re.search(rf"^{re.escape(name)}\{{", text, re.M), name
    assert metric(http, "cadence:generation_tokens_total") > 0


# ---- bad input ---------------------------------------------------------------------------------------


def _is_error(r: httpx.Response, status: int) -> dict:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) >= {"message", "type", "param", "code"} and err["message"]
    return err


@pytest.mark.parametrize(
    "path, body, param",
    [
        ("/v1/completions", {"prompt": "x", "max_tokens": -1}, "max_tokens"),
        ("/v1/completions", {"prompt": "x", "max_tokens": 10**9}, "max_tokens"),
        ("/v1/completions", {"prompt": "x", "temperature": -2}, "temperature"),
        ("/v1/completions", {"prompt": "x", "top_p": 7}, "top_p"),
        ("/v1/completions", {"prompt": "x", "n": 0}, "n"),
        ("/v1/completions", {"prompt": "x", "logprobs": 1000}, "logprobs"),
        ("/v1/completions", {"prompt": []}, "prompt"),
        ("/v1/completions", {"prompt": [1, 2, 10**8]}, "prompt"),
        ("/v1/completions", {"max_tokens": 5}, "prompt"),
        ("/v1/completions", {"prompt": "x", "logit_bias": {"abc": 1}}, None),
        ("/v1/chat/completions", {"messages": [{"role": "wizard", "content": "hi"}]}, "messages"),
        ("/v1/chat/completions", {"messages": []}, "messages"),
        (
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": "hi"}], "presence_penalty": 5},
            "presence_penalty",
        ),
    ],
)
def test_bad_parameters_get_400_error_objects(http, model_name, path, body, param):
    err = _is_error(http.post(path, json={"model": model_name, **body}), 400)
    if param is not None:
        assert param in (err["param"] or "") or param in err["message"]


def test_prompt_plus_max_tokens_over_context(http, model_name):
    long_prompt = "hello " * 2100
    err = _is_error(
        http.post(
            "/v1/completions", json={"model": model_name, "prompt": long_prompt, "max_tokens": 5}
        ),
        400,
    )
    assert "context length" in err["message"]
    err = _is_error(
        http.post(
            "/v1/completions", json={"model": model_name, "prompt": "hi", "max_tokens": 2048}
        ),
        400,
    )
    assert err["code"] == "context_length_exceeded"


def test_malformed_json_and_unknown_model(http, server, model_name):
    r = http.post(
        "/v1/completions", content=b'{"prompt": "x", ', headers={"content-type": "application/json"}
    )
    _is_error(r, 400)
    err = _is_error(http.post("/v1/completions", json={"model": "gpt-17", "prompt": "x"}), 404)
    assert err["code"] == "model_not_found"
    with pytest.raises(openai.NotFoundError):
        openai.OpenAI(
            base_url=server.url + "/v1", api_key=API_KEY, max_retries=0
        ).completions.create(model="nope", prompt="x")


def test_api_key_required_everywhere_but_health(server):
    base = server.url
    assert httpx.post(base + "/v1/completions", json={"prompt": "x"}).status_code == 401
    bad = httpx.post(
        base + "/v1/completions", json={"prompt": "x"}, headers={"Authorization": "Bearer wrong"}
    )
    assert bad.status_code == 401 and bad.json()["error"]["code"] == "invalid_api_key"
    assert httpx.get(base + "/v1/models").status_code == 401
    assert httpx.get(base + "/health").status_code == 200
    assert httpx.get(base + "/metrics").status_code == 401  # unless --metrics-public
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=base + "/v1", api_key="wrong", max_retries=0).models.list()


def test_server_survives_all_of_the_above(http, client, model_name):
    assert http.get("/health").status_code == 200
    assert (
        client.completions.create(
            model=model_name, prompt="Still alive?", max_tokens=3
        ).usage.completion_tokens
        >= 1
    )


def test_cadence_chat_streams_a_reply(server):
    """`cadence chat` against the running server: a line in, a streamed reply out."""
    import subprocess
    import sys

    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "cadence.cli.main",
            "chat",
            "--url",
            server.url,
            "--api-key",
            API_KEY,
            "--max-tokens",
            "8",
            "--temperature",
            "0",
        ],
        input="Say hello.\n\n",
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip()  # the streamed reply
    assert "chatting with" in proc.stderr
