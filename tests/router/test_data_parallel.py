"""Data parallelism on the CPU with the tiny Llama: `cadence serve -dp 2` (two replicas
behind its router) and `cadence router` in front of those replicas, under each policy.
Greedy output equals one engine's; the cache-aware policy keeps a prefix's requests on one
replica (seen in the replicas' own prefix-hit counters); a replica killed mid-stream ends
its stream with an error event, leaves the rotation, and the router serves on."""

from __future__ import annotations

import concurrent.futures as cf
import json
import os
import signal

import httpx
import pytest
from model_helpers import make_prompts
from router_helper import router
from server_helper import Server, children, metric

pytestmark = pytest.mark.slow  # starts servers of its own (make test-fast skips it)

ARGS = ["--device", "cpu", "--dtype", "float32", "--num-gpu-blocks-override", "512"]
ARGS += ["--max-model-len", "512", "--cpu-threads", "1"]
POLICIES = ["round-robin", "least-load", "cache-aware"]


@pytest.fixture(scope="module")
def dp(tiny_model_dir):
    """(the -dp 2 server, its replicas' URLs)."""
    srv = Server([tiny_model_dir("llama"), *ARGS, "-dp", "2"])
    try:
        srv.wait_ready(300)
        status = httpx.get(srv.url + "/v1/router/replicas").json()
        assert status["policy"] == "cache-aware" and len(status["replicas"]) == 2
        yield srv, [r["url"] for r in status["replicas"]]
    finally:
        srv.stop()


def complete(url: str, prompt: list[int], max_tokens: int = 12) -> dict:
    body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True}
    r = httpx.post(url + "/v1/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()


def prefix_hits(urls: list[str]) -> list[float]:
    return [metric(httpx.Client(base_url=u), "cadence:prefix_cache_hits_total") for u in urls]


@pytest.mark.parametrize("policy", POLICIES)
def test_greedy_output_equals_one_engine(dp, policy):
    _, urls = dp
    prompts = make_prompts(512, [3, 17, 40, 70, 9, 33], seed=11)
    want = [complete(urls[0], p)["choices"][0]["text"] for p in prompts]  # one engine
    with router(urls, policy) as url, cf.ThreadPoolExecutor(6) as pool:
        got = list(pool.map(lambda p: complete(url, p)["choices"][0]["text"], prompts))
        sent = httpx.get(url + "/metrics").text
    assert got == want
    per_replica = [metric_line(sent, "cadence:router_requests_total", u) for u in urls]
    assert sum(per_replica) == len(prompts)
    if policy == "round-robin":
        assert per_replica == [3, 3]


def metric_line(text: str, name: str, replica: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + "{") and f'replica="{replica}"' in line:
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_streams_pass_through_the_dp_server(dp):
    srv, urls = dp
    prompt = make_prompts(512, [21], seed=12)[0]
    want = complete(urls[1], prompt, 16)["choices"][0]["text"]
    body = {"prompt": prompt, "max_tokens": 16, "temperature": 0, "stream": True}
    body["ignore_eos"] = True
    text, events = "", 0
    with httpx.stream("POST", srv.url + "/v1/completions", json=body, timeout=60) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        for line in r.iter_lines():
            if line.startswith("data: {"):
                text += json.loads(line[6:])["choices"][0]["text"]
                events += 1
    assert text == want and events > 1


def shared_prefix_hits(url: str, urls: list[str], seed: int) -> float:
    """3 system prompts x 4 questions, one at a time: the replicas' prefix-hit tokens."""
    before = sum(prefix_hits(urls))
    for g, system in enumerate(make_prompts(512, [96, 96, 96], seed=seed)):
        for q in make_prompts(512, [8] * 4, seed=seed * 10 + g):
            complete(url, system + q, 2)
    return sum(prefix_hits(urls)) - before


def test_cache_aware_keeps_a_prefix_on_one_replica(dp):
    srv, urls = dp
    # Every question after a group's first finds the 96-token system prompt (6 blocks)
    # cached: only possible if all four went to the same replica.
    assert shared_prefix_hits(srv.url, urls, seed=21) == 3 * 3 * 96
    with router(urls, "round-robin") as url:
        assert shared_prefix_hits(url, urls, seed=22) < 3 * 3 * 96  # alternating: misses
    decisions = httpx.get(srv.url + "/metrics").text
    assert 'cadence:router_decisions_total{reason="cache_hit"} 9.0' in decisions


def samples(text: str, name: str) -> dict[str, float]:
    """name's lines of an exposition text: the replica label's value -> the value, summed
    over the other labels."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith(name + "{"):
            replica = line.split('replica="', 1)[1].split('"', 1)[0] if "replica=" in line else ""
            out[replica] = out.get(replica, 0.0) + float(line.rsplit(" ", 1)[1])
    return out


def test_the_dp_server_shows_its_replicas_metrics_summed_and_per_replica(dp):
    srv, urls = dp
    for p in make_prompts(512, [5, 9, 14, 21], seed=3):
        complete(srv.url, p, 6)
    text = httpx.get(srv.url + "/metrics").text
    assert "cadence:router_requests_total" in text  # the router's own, still there
    for name in ("cadence:generation_tokens_total", "cadence:request_success_total",
                 "cadence:prefix_cache_queries_total", "cadence:time_to_first_token_seconds_count"):  # fmt: skip
        seen = samples(text, name)
        direct = [metric(httpx.Client(base_url=u), name) for u in urls]
        assert [seen[u] for u in urls] == direct, name
        assert seen["all"] == sum(direct), name
    usage = samples(text, "cadence:kv_cache_usage_perc")
    assert 0 <= usage["all"] <= 1, "a fraction is averaged, not summed"


def test_the_dp_server_shows_the_engine_view_and_the_web_app(dp):
    srv, urls = dp
    complete(srv.url, make_prompts(512, [7], seed=5)[0], 4)
    own = [httpx.get(u + "/v1/engine/stats").json() for u in urls]
    summed = httpx.get(srv.url + "/v1/engine/stats").json()
    assert summed["replicas"] == urls
    assert summed["requests"]["finished"] == sum(o["requests"]["finished"] for o in own)
    assert summed["kv_cache"]["num_blocks"] == sum(o["kv_cache"]["num_blocks"] for o in own)
    one = httpx.get(srv.url + "/v1/engine/stats", params={"replica": 1}).json()
    assert one["requests"]["finished"] == own[1]["requests"]["finished"] and "replicas" not in one
    steps = httpx.get(srv.url + "/v1/engine/steps", params={"replica": 1, "limit": 3}).json()
    assert steps["num_steps"] == httpx.get(urls[1] + "/v1/engine/steps").json()["num_steps"]
    table = httpx.get(srv.url + "/v1/engine/requests", params={"replica": 0}).json()
    assert "requests" in table
    for bad in ("2", "-1", "x"):
        r = httpx.get(srv.url + "/v1/engine/steps", params={"replica": bad})
        assert r.status_code == 400 and "replica must be" in r.json()["error"]["message"]
    page = httpx.get(srv.url + "/")
    assert page.status_code == 200 and "/ui/engine.js" in page.text
    assert httpx.get(srv.url + "/ui/engine.js").status_code == 200


def test_the_web_apps_engine_view_shows_each_replica_through_the_router(dp):
    """In Chromium, as a user opens it: the engine view offers the replicas and shows the
    one picked (its step count, not the other's)."""
    from browser_helper import browser_page, read_int, wait_until

    srv, urls = dp
    for i, u in enumerate(urls):  # different step counts on the two replicas
        for p in make_prompts(512, [4] * (1 + 3 * i), seed=20 + i):
            complete(u, p, 3)
    steps = [httpx.get(u + "/v1/engine/stats").json()["num_steps"] for u in urls]
    assert steps[0] != steps[1]
    with browser_page(srv.url + "/") as page:
        page.click("#tab-engine")
        pick = page.wait_for_selector("#replica-pick", timeout=20_000)
        options = [o.inner_text() for o in pick.query_selector_all("option")]
        assert options == [f"replica {i} ({u})" for i, u in enumerate(urls)]
        wait_until(page, lambda: read_int(page, "#stat-steps") == steps[0], what="replica 0")
        page.select_option("#replica-pick", "1")
        wait_until(page, lambda: read_int(page, "#stat-steps") == steps[1], what="replica 1")
        assert not page.errors, page.errors
        assert all(u.startswith(srv.url + "/") for u in page.urls), "only the router is asked"


def test_a_replica_killed_mid_stream_fails_its_stream_and_the_router_serves_on(dp):
    srv, urls = dp
    body = {"prompt": [5, 6, 7], "max_tokens": 500, "ignore_eos": True, "stream": True}
    events = []
    with httpx.stream("POST", srv.url + "/v1/completions", json=body, timeout=60) as r:
        lines = r.iter_lines()
        for line in lines:
            if line.startswith("data: {"):
                break
        status = httpx.get(srv.url + "/v1/router/replicas").json()["replicas"]
        victim = next(rep for rep in status if rep["in_flight"] == 1)
        # The replicas are the launcher's children, started in the order it lists them.
        pids = sorted(p for p, cmd in children(srv.proc.pid) if cmd.startswith(b"cadence::api"))
        assert len(pids) == 2
        os.kill(pids[urls.index(victim["url"])], signal.SIGKILL)
        events = [line for line in lines if line.startswith("data: ")]
    assert events[-1] == "data: [DONE]"
    error = json.loads(events[-2][6:])["error"]
    assert "failed mid-stream" in error["message"] and error["code"] == 502
    status = {r["url"]: r for r in httpx.get(srv.url + "/v1/router/replicas").json()["replicas"]}
    assert not status[victim["url"]]["healthy"]
    assert httpx.get(srv.url + "/health").status_code == 200
    for prompt in make_prompts(512, [4, 8, 12], seed=31):  # all on the survivor
        complete(srv.url, prompt, 4)
