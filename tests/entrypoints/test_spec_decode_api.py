"""`cadence serve --speculative-config`: the OpenAI API streams what it would without
speculation, /version states the configuration, /metrics counts drafts and acceptances,
and a bad configuration is a usage error naming the problem."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import httpx
import pytest
from openai import OpenAI
from server_helper import Server

pytestmark = pytest.mark.slow  # starts servers of its own (make test-fast skips it)

SPEC = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 2}
PROMPT = (
    "Repeat this sentence twice: The committee approved the budget for the new library "
    "on Tuesday evening."
)


@pytest.fixture(scope="module")
def spec_server():
    args = ["--dtype", "float32", "--kv-cache-memory", str(128 * 2**20), "--max-model-len", "1024"]
    srv = Server([*args, "--speculative-config", json.dumps(SPEC)])
    try:
        srv.wait_ready()
        yield srv
    finally:
        srv.stop()


def metric(text: str, name: str) -> float:
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            total += float(line.rsplit(" ", 1)[1])
    return total


def test_version_states_the_config(spec_server):
    info = httpx.get(spec_server.url + "/version").json()
    assert info["speculative_config"]["method"] == "ngram"
    assert info["speculative_config"]["num_speculative_tokens"] == 4


def test_streamed_text_is_the_plain_text_and_drafts_are_counted(spec_server, client, model_name):
    """`client` is the shared server without speculation: the same greedy text."""
    spec = OpenAI(base_url=spec_server.url + "/v1", api_key="x", max_retries=0, timeout=120)
    messages = [{"role": "user", "content": PROMPT}]
    want = (
        client.chat.completions.create(
            model=model_name, messages=messages, max_tokens=48, temperature=0
        )
        .choices[0]
        .message.content
    )
    stream = spec.chat.completions.create(
        model=spec.models.list().data[0].id,
        messages=messages,
        max_tokens=48,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    pieces, usage = [], None
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            pieces.append(chunk.choices[0].delta.content)
        usage = chunk.usage or usage
    assert "".join(pieces) == want
    assert usage.completion_tokens <= 48
    text = httpx.get(spec_server.url + "/metrics").text
    drafts = metric(text, "cadence:spec_decode_num_draft_tokens_total")
    accepted = metric(text, "cadence:spec_decode_num_accepted_tokens_total")
    assert 0 < accepted <= drafts
    assert metric(text, "cadence:spec_decode_acceptance_length_count") == metric(
        text, "cadence:spec_decode_num_drafts_total"
    )
    first = re.search(
        r'spec_decode_num_accepted_tokens_per_pos_total\{.*position="0"\} (\S+)', text
    )
    assert first and float(first.group(1)) > 0
    # The engine view's counters are the same.
    view = httpx.get(spec_server.url + "/v1/engine/stats").json()["speculative_decoding"]
    assert (view["draft_tokens"], view["accepted_tokens"]) == (drafts, accepted)
    assert view["verifications"] == metric(text, "cadence:spec_decode_num_drafts_total")
    assert view["acceptance_rate"] == pytest.approx(accepted / drafts)


@pytest.mark.parametrize(
    "value,message",
    [
        ('{"method": "medusa", "num_speculative_tokens": 2}', "unknown speculative method"),
        ('{"method": "ngram"}', "num_speculative_tokens"),
        ('{"method": "draft_model", "num_speculative_tokens": 2}', "needs a model"),
        ("{not json", "not valid JSON"),
    ],
)
def test_bad_config_is_a_usage_error(value, message):
    proc = subprocess.run(
        [sys.executable, "-m", "cadence.cli.main", "serve", "--speculative-config", value],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    assert message in proc.stderr


def test_bench_serve_reports_the_acceptance(spec_server, capsys):
    from cadence.cli.main import main

    code = main(
        ["bench", "serve", "--base-url", spec_server.url, "--disable-tqdm", "--num-prompts",
         "4", "--random-input-len", "24", "--random-output-len", "24", "--ignore-eos",
         "--num-warmups", "0", "--temperature", "0"]
    )  # fmt: skip
    assert code == 0
    out = capsys.readouterr().out
    assert "Speculative Decoding" in out and "Acceptance length:" in out
