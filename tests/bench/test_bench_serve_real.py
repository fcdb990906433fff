"""`cadence bench serve` against a real `cadence serve` on SmolLM2: a short run and a
sweep of 1,2. The JSON, the scoreboard and the PNGs must be written, and the JSON's token
totals (warm-ups included, counted apart) must match the server's /metrics counters."""

from __future__ import annotations

import json
import subprocess
import time

import httpx
import pytest

from cadence.cli.main import main

pytestmark = pytest.mark.slow

PROMPTS, INPUT_LEN, OUTPUT_LEN = 4, 16, 6
COUNTERS = (
    "cadence:generation_tokens_total",
    "cadence:prompt_tokens_total",
    "cadence:request_success_total",
    "cadence:time_to_first_token_seconds_sum",
    "cadence:time_to_first_token_seconds_count",
)


@pytest.fixture(scope="module")
def real_server(entrypoints_helpers, smollm2_dir):
    h = entrypoints_helpers
    srv = h.Server(
        ["--dtype", "float32", "--api-key", h.API_KEY, "--max-num-seqs", "4",
         "--max-model-len", "256", "--kv-cache-memory", str(64 * 2**20)]
    )  # fmt: skip
    try:
        srv.wait_ready()
        yield srv, h.API_KEY
    finally:
        srv.stop()


def counters(url: str, key: str) -> dict[str, float]:
    """The counters' totals over every label set (/metrics needs the key with --api-key)."""
    resp = httpx.get(url + "/metrics", headers={"Authorization": f"Bearer {key}"}, timeout=30)
    resp.raise_for_status()
    text = resp.text
    out = dict.fromkeys(COUNTERS, 0.0)
    for line in text.splitlines():
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name in out:
            out[name] += float(line.rsplit(" ", 1)[1])
    return out


def bench(url: str, key: str, *flags: str) -> int:
    return main(["bench", "serve", "--base-url", url, "--api-key", key, "--disable-tqdm",
                 "--num-prompts", str(PROMPTS), "--random-input-len", str(INPUT_LEN),
                 "--random-output-len", str(OUTPUT_LEN), "--ignore-eos", *flags])  # fmt: skip


def test_real_run_and_sweep_agree_with_server_metrics(real_server, smollm2_dir, tmp_path):
    srv, key = real_server
    one, sweep = tmp_path / "one.json", tmp_path / "sweep.json"
    board = tmp_path / "SCOREBOARD.md"
    before = counters(srv.url, key)
    assert bench(srv.url, key, "--save-json", str(one), "--scoreboard", str(board),
                 "--label", "single", "--plot", str(tmp_path / "one.png")) == 0  # fmt: skip
    assert bench(srv.url, key, "--sweep", "1,2", "--save-json", str(sweep),
                 "--scoreboard", str(board), "--label", "sweep",
                 "--plot", str(tmp_path / "sweep.png")) == 0  # fmt: skip
    results = [json.loads(one.read_text()), json.loads(sweep.read_text())]
    runs = [run for r in results for run in r["runs"]]
    assert [run["max_concurrency"] for run in runs] == [None, 1, 2]

    # every request as asked: the server's usage against the same tokenizer
    for run in runs:
        assert len(run["requests"]) == PROMPTS
        for r in run["requests"]:
            assert r["success"], r["error"]
            assert r["usage_source"] == "server"
            assert r["output_tokens"] == r["max_tokens"] == OUTPUT_LEN
            assert r["prompt_tokens"] == r["tokenizer_prompt_tokens"]
            assert abs(r["prompt_tokens"] - INPUT_LEN) <= 1
            assert 0 < r["ttft_s"] <= r["e2e_s"]
            assert 1 <= len(r["itl_s"]) <= OUTPUT_LEN - 1
        s = run["summary"]
        assert s["completed"] == PROMPTS and s["failed"] == 0
        assert s["total_output_tokens"] == PROMPTS * OUTPUT_LEN
        assert s["total_input_tokens"] == sum(r["prompt_tokens"] for r in run["requests"])
        assert s["output_throughput"] == pytest.approx(s["total_output_tokens"] / s["duration"])
        check = run["token_check"]
        assert check["prompt_mismatches"] == 0 and check["short_outputs"] == 0
    c1 = results[1]["runs"][0]["requests"]  # concurrency 1: one after another
    for a, b in zip(c1, c1[1:]):
        assert b["start_s"] >= a["start_s"] + a["e2e_s"] - 1e-6

    # the server's counters moved by exactly the JSONs' totals plus the warm-ups
    want_gen = sum(run["summary"]["total_output_tokens"] for run in runs)
    want_gen += sum(r["warmup"]["output_tokens"] for r in results)
    want_prompt = sum(run["summary"]["total_input_tokens"] for run in runs)
    want_prompt += sum(r["warmup"]["prompt_tokens"] for r in results)
    want_requests = sum(run["summary"]["completed"] for run in runs)
    want_requests += sum(r["warmup"]["completed"] for r in results)
    assert [r["warmup"]["requests"] for r in results] == [1, 1]
    deadline = time.monotonic() + 10
    while True:  # counters are fed as outputs arrive: allow a moment to settle
        after = counters(srv.url, key)
        delta = {k: after[k] - before[k] for k in COUNTERS}
        if delta["cadence:request_success_total"] >= want_requests or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert delta["cadence:generation_tokens_total"] == want_gen
    assert delta["cadence:prompt_tokens_total"] == want_prompt
    assert delta["cadence:request_success_total"] == want_requests
    assert delta["cadence:time_to_first_token_seconds_count"] == want_requests
    # the server's TTFT starts after the client sends, so it cannot exceed the client's;
    # the client's adds only HTTP and tokenizing, small beside a prefill
    client_ttft = sum(r["ttft_s"] for run in runs for r in run["requests"])
    client_ttft += sum(t for r in results for t in r["warmup"]["ttft_s"])
    server_ttft = delta["cadence:time_to_first_token_seconds_sum"]
    assert 0.5 * client_ttft <= server_ttft <= client_ttft

    # the context of each result
    auth = {"Authorization": f"Bearer {key}"}
    models = httpx.get(srv.url + "/v1/models", headers=auth).json()
    version = httpx.get(srv.url + "/version", headers=auth).json()
    head = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True)
    for r in results:
        assert r["model"] == models["data"][0]["id"]
        assert r["server_version"] == version
        assert r["tokenizer"] == smollm2_dir  # the server's model folder, from /v1/models
        assert r["endpoint"] == "completions" and r["dataset"]["name"] == "random"
        assert r["command"].startswith("cadence bench serve --base-url")
        if head.returncode == 0:
            assert r["git_commit"] == head.stdout.strip()
        assert r["date"]
    assert "--sweep 1,2" in results[1]["command"]

    # the scoreboard: a header, then one row per run, numbers as in the JSON
    lines = board.read_text().splitlines()
    assert len(lines) == 2 + 3
    rows = [[c.strip() for c in line.strip("|").split(" | ")] for line in lines[2:]]
    assert [row[1] for row in rows] == ["single", "sweep", "sweep"]
    assert [row[6] for row in rows] == ["unlimited", "1", "2"]
    for row, run in zip(rows, runs):
        assert float(row[9]) == pytest.approx(run["summary"]["output_throughput"], abs=0.051)
        assert float(row[10]) == pytest.approx(run["summary"]["median_ttft_ms"], abs=0.051)
    for name in ("one.png", "sweep.png"):
        data = (tmp_path / name).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000


def test_real_server_wrong_api_key(real_server, capsys):
    srv, _ = real_server
    rc = main(["bench", "serve", "--base-url", srv.url, "--api-key", "wrong", "--disable-tqdm"])
    assert rc == 1
    assert "refused the API key (401: invalid or missing API key); give --api-key" in (
        capsys.readouterr().err
    )


def test_real_server_short_soak(real_server, tmp_path):
    """The soak options against the real server: every invalid body is refused with a 4xx
    and an error object, hang-ups cut their answers, /health answers throughout, and the
    RSS comes from both processes (the API server and its engine)."""
    srv, key = real_server
    out = tmp_path / "soak.json"
    rc = bench(srv.url, key, "--max-concurrency", "4", "--duration", "4",
               "--hangup-fraction", "0.25", "--invalid-fraction", "0.25", "--seed", "1",
               "--server-pid", str(srv.proc.pid), "--rss-interval", "1",
               "--save-json", str(out))  # fmt: skip
    assert rc == 0
    run = json.loads(out.read_text())["runs"][0]
    soak, s = run["soak"], run["summary"]
    tally = soak["tally"]
    assert tally["sent"]["invalid"] >= 1 and tally["sent"]["hangup"] >= 1
    assert tally["invalid_ok"] == tally["sent"]["invalid"], tally
    assert tally["hangups"] + tally["hangups_late"] == tally["sent"]["hangup"]
    assert soak["errors_by_kind"] == {}
    assert s["completed"] == tally["sent"]["normal"] >= 1 and s["failed"] == 0
    assert soak["health"]["non_200"] == 0 and soak["health"]["probes"] >= 6
    rss = soak["rss"]
    assert len(rss["samples"]) >= 4
    procs = rss["samples"][-1]["processes"]
    for pid in (srv.proc.pid, srv.engine_pid()):
        assert procs[str(pid)] > 50  # MiB: a Python process with torch
    assert httpx.get(srv.url + "/health", timeout=10).status_code == 200
