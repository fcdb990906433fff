"""The engine view's endpoints (/v1/engine/stats, /steps, /requests, the profiler), spoken
to with httpx and the `openai` client: their shape, their auth, and that what they say is
true (counts agree with /metrics and with what the requests needed)."""

from __future__ import annotations

import gzip
import json
import threading

import httpx
from server_helper import metric

from cadence.engine.step_timeline import FIELDS


def test_stats_shape_and_agreement_with_metrics(http, client, model_name):
    prompt = "Counting: " + ", ".join(str(i) for i in range(1, 30))  # two full KV blocks
    client.completions.create(model=model_name, prompt=prompt, max_tokens=4)
    stats = http.get("/v1/engine/stats").json()
    assert stats["object"] == "engine.stats" and stats["model"] == model_name
    assert stats["healthy"] and not stats["draining"] and stats["num_steps"] > 0
    req, kv, pc = stats["requests"], stats["kv_cache"], stats["prefix_cache"]
    assert {"running", "waiting", "preempted", "in_flight", "finished", "rejected"} <= set(req)
    assert kv["used_blocks"] + kv["cached_blocks"] + kv["free_blocks"] == kv["num_blocks"]
    assert kv["cached_blocks"] > 0  # the prompt's full blocks stay cached after it ended
    # Nothing runs between the two readings: every counter equals its /metrics series.
    assert stats["tokens"]["prompt"] == metric(http, "cadence:prompt_tokens_total")
    assert stats["tokens"]["generation"] == metric(http, "cadence:generation_tokens_total")
    assert req["finished"] == metric(http, "cadence:request_success_total")
    assert req["rejected"] == metric(http, "cadence:requests_rejected_total")
    assert req["running"] == metric(http, "cadence:num_requests_running")
    assert req["waiting"] == metric(http, "cadence:num_requests_waiting")
    assert stats["preemptions"] == metric(http, "cadence:num_preemptions_total")
    assert pc["hit_tokens"] == metric(http, "cadence:prefix_cache_hits_total")
    assert pc["queried_tokens"] == metric(http, "cadence:prefix_cache_queries_total")
    assert kv["usage"] == metric(http, "cadence:kv_cache_usage_perc")
    ttft = stats["latency"]["time_to_first_token"]
    assert ttft["count"] == metric(http, "cadence:time_to_first_token_seconds_count")
    assert stats["structured_outputs"]["requests"] >= 0
    assert stats["speculative_decoding"] is None  # not configured on this server
    # a CPU server: no bound on prompt tokens beside decodes, no pacer (step_pacer.py)
    assert stats["scheduler"] == {"prefill_cap": 0, "decode_step_ms": 0.0}


def test_steps_account_for_the_tokens_of_a_request(http, client, model_name):
    before = http.get("/v1/engine/steps", params={"limit": 1}).json()
    assert before["capacity"] == 1024
    last = before["steps"][-1]["id"] if before["steps"] else 0
    ids = http.post("/tokenize", json={"prompt": "A unique prompt about step timelines " * 5})
    prompt = ids.json()["tokens"]
    r = client.completions.create(
        model=model_name,
        prompt=prompt,
        max_tokens=7,
        temperature=0,
        extra_body={"ignore_eos": True},
    )
    cached = r.usage.prompt_tokens_details.cached_tokens if r.usage.prompt_tokens_details else 0
    steps = http.get("/v1/engine/steps", params={"since": last}).json()["steps"]
    assert steps and all(list(s) == list(FIELDS) for s in steps)
    assert [s["id"] for s in steps] == list(range(last + 1, last + 1 + len(steps)))
    assert sum(s["prefill_tokens"] for s in steps) == len(prompt) - cached
    assert sum(s["decode_seqs"] for s in steps) == r.usage.completion_tokens - 1 == 6
    assert all(s["forward_ms"] > 0 and s["schedule_ms"] >= 0 for s in steps)
    assert http.get("/v1/engine/steps", params={"limit": -1}).status_code == 400


def test_requests_lists_a_request_in_flight(http, client, model_name):
    started = threading.Event()
    done = threading.Event()

    def stream():
        for _ in client.completions.create(
            model=model_name,
            prompt="Tell me a long story about a lighthouse keeper.",
            max_tokens=400,
            stream=True,
            extra_body={"ignore_eos": True},
        ):
            started.set()
            if done.is_set():
                break  # hang up: the server aborts the request

    t = threading.Thread(target=stream)
    t.start()
    try:
        assert started.wait(60)
        table = http.get("/v1/engine/requests").json()
        assert table["total"] == len(table["requests"]) >= 1
        row = table["requests"][0]
        assert row["state"] == "running" and row["prompt_tokens"] > 5
        assert row["output_tokens"] >= 1 and row["age_s"] >= 0
        assert http.get("/v1/engine/stats").json()["requests"]["running"] >= 1
    finally:
        done.set()
        t.join(60)


def test_profiler_writes_a_perfetto_trace(http, client, model_name, profile_dir):
    started = http.post("/start_profile").json()
    assert started["profiling"] and "CPU" in started["activities"]
    again = http.post("/start_profile")
    assert again.status_code == 400 and "already" in again.json()["error"]["message"]
    client.completions.create(model=model_name, prompt="Profile me", max_tokens=3)
    stopped = http.post("/stop_profile").json()
    assert stopped["trace"].startswith(str(profile_dir)) and stopped["trace"].endswith(".json.gz")
    with gzip.open(stopped["trace"]) as f:
        events = json.load(f)["traceEvents"]
    assert any(e.get("name") == "cadence::step" for e in events)
    assert http.post("/stop_profile").status_code == 400


def test_auth_the_page_is_public_the_data_is_not(server):
    with httpx.Client(base_url=server.url, timeout=30) as anon:
        page = anon.get("/")
        assert page.status_code == 200 and "<title>Cadence</title>" in page.text
        assert "default-src 'self'" in page.headers["content-security-policy"]
        assert anon.get("/ui/engine.js").status_code == 200
        assert anon.get("/ui/nothing.js").status_code == 404
        for path in ("/v1/engine/stats", "/v1/engine/steps", "/v1/engine/requests"):
            r = anon.get(path)
            assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
        for path in ("/start_profile", "/stop_profile"):
            assert anon.post(path).status_code == 401
