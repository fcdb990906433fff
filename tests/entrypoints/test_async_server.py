"""`cadence serve --async-scheduling` (the default on CUDA), spoken to like any server: it
answers exactly what the synchronous server answers, streamed or not, with stop strings,
several choices and JSON schemas, and a hang-up mid-stream leaves nothing running."""

from __future__ import annotations

import concurrent.futures as cf
import json
import time

import httpx
import pytest
from server_helper import API_KEY, Server

pytestmark = pytest.mark.slow  # starts servers of its own (make test-fast skips it)

ARGS = ["--dtype", "float32", "--api-key", API_KEY, "--max-num-seqs", "8"]
ARGS += ["--kv-cache-memory", str(256 * 2**20), "--max-model-len", "2048"]
CHATS = [
    [{"role": "user", "content": "Name three colours."}],
    [{"role": "user", "content": "Count from one to ten in words."}],
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "user", "content": "Say hello in French, then in Spanish."}],
]


@pytest.fixture(scope="module")
def async_server():
    srv = Server([*ARGS, "--async-scheduling"])
    try:
        srv.wait_ready()
        yield srv
    finally:
        srv.stop()


def _client(server):
    from openai import OpenAI

    return OpenAI(base_url=server.url + "/v1", api_key=API_KEY, max_retries=0, timeout=120)


def _answers(server, model, stream: bool) -> list[tuple[str, str]]:
    """(text, finish_reason) of every chat, all sent at once."""
    client = _client(server)

    def one(messages):
        kw = dict(model=model, messages=messages, temperature=0, max_tokens=16, stop=[". "])
        if not stream:
            choice = client.chat.completions.create(**kw).choices[0]
            return choice.message.content, choice.finish_reason
        text, finish = "", None
        for chunk in client.chat.completions.create(**kw, stream=True):
            if chunk.choices:
                text += chunk.choices[0].delta.content or ""
                finish = chunk.choices[0].finish_reason or finish
        return text, finish

    with cf.ThreadPoolExecutor(len(CHATS)) as pool:
        return list(pool.map(one, CHATS))


def test_answers_equal_the_synchronous_server(async_server, server, model_name):
    reference = _answers(server, model_name, stream=False)
    assert _answers(async_server, model_name, stream=False) == reference
    assert _answers(async_server, model_name, stream=True) == reference


def test_several_choices_and_a_json_schema(async_server, server, model_name):
    schema = {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 20}, "year": {"type": "integer"}},
        "required": ["city", "year"],
    }
    kw = dict(
        model=model_name,
        messages=[{"role": "user", "content": "A city and a year, as JSON."}],
        temperature=0,
        max_tokens=40,
        n=2,
        response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": schema}},
    )
    got = _client(async_server).chat.completions.create(**kw)
    want = _client(server).chat.completions.create(**kw)
    assert [c.message.content for c in got.choices] == [c.message.content for c in want.choices]
    for choice in got.choices:
        assert set(json.loads(choice.message.content)) == {"city", "year"}


def test_hang_up_mid_stream_leaves_nothing_running(async_server, model_name):
    body = {
        "model": model_name,
        "prompt": "Write an endless essay.",
        "max_tokens": 1500,
        "ignore_eos": True,
        "stream": True,
    }
    headers = {"Authorization": f"Bearer {API_KEY}"}
    with httpx.stream(
        "POST", async_server.url + "/v1/completions", json=body, headers=headers, timeout=60
    ) as r:
        lines = r.iter_lines()  # held, so the connection stays open until we leave
        for _ in range(6):
            next(lines)

    def running() -> float:
        text = httpx.get(async_server.url + "/metrics", headers=headers).text
        return sum(
            float(line.rsplit(" ", 1)[1])
            for line in text.splitlines()
            if line.startswith("cadence:num_requests_running")
        )

    deadline = time.monotonic() + 10
    while running() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert running() == 0
    # and the engine still serves
    out = _client(async_server).completions.create(
        model=model_name, prompt="Hello", max_tokens=5, temperature=0
    )
    assert out.usage.completion_tokens == 5
