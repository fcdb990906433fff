"""The soak options of `cadence bench serve`, against the stub server (tests/bench/conftest.py):
--duration keeps the clients busy until the time is up, hang-ups are real (the stub sees its
answers cut), invalid bodies count as answered only with a 4xx and an OpenAI error object,
/health is probed, and --server-pid reads the RSS of the process and its descendants."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from cadence.bench.soak import INVALID_KINDS, invalid_body, is_error_object
from cadence.cli.main import main


def write_jsonl(path, items) -> str:
    path.write_text("".join(json.dumps(x) + "\n" for x in items))
    return str(path)


def soak(url: str, tmp_path, items, *flags: str) -> tuple[int, dict]:
    prompts = write_jsonl(tmp_path / "p.jsonl", items)
    out = tmp_path / "r.json"
    rc = main(["bench", "serve", "--base-url", url, "--disable-tqdm", "--dataset-name", "jsonl",
               "--dataset-path", prompts, "--tokenizer", "none", "--num-warmups", "0",
               "--save-json", str(out), *flags])  # fmt: skip
    with open(out) as f:
        return rc, json.load(f)


def wait_for(cond, timeout: float = 5.0) -> bool:
    """Bounded wait for the stub to notice what the client did (a cut connection)."""
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def test_duration_keeps_every_client_busy_until_the_time_is_up(stub, stub_url, tmp_path, capsys):
    items = [{"prompt": f"ttft=40 itl=20 p{i}", "max_tokens": 3} for i in range(3)]
    rc, result = soak(stub_url, tmp_path, items, "--duration", "1.2", "--max-concurrency", "3")
    assert rc == 0
    run = result["runs"][0]
    s = run["summary"]
    # ~80 ms a request, 3 clients, 1.2 s: far more requests than the 3 prompts
    assert s["completed"] >= 9 and s["failed"] == 0
    assert 1.2 <= s["duration"] < 1.2 + 0.5  # the last requests end shortly after the time
    assert stub.max_in_flight == 3
    # the prompts are reused in turn
    sent = [b["prompt"] for b in stub.bodies]
    assert sent[:3] == [it["prompt"] for it in items] and len(set(sent)) == 3
    assert result["config"]["duration_s"] == 1.2
    soak_block = run["soak"]
    assert soak_block["tally"]["sent"] == {"normal": s["completed"]}
    assert soak_block["errors_by_kind"] == {}
    health = soak_block["health"]
    assert 2 <= health["probes"] <= 4 and health["probes"] == stub.health_probes
    assert health["non_200"] == 0 and 0 < health["p50_ms"] <= health["p99_ms"] <= health["max_ms"]
    assert soak_block["rss"] is None  # no --server-pid
    out = capsys.readouterr().out
    assert "---- soak ----" in out and f"normal requests done:    {s['completed']}" in out


def test_hangups_cut_streams_and_plain_requests_mid_answer(stub, stub_url, tmp_path):
    # 2.05 s to answer each: every cut (1-2 tokens, or 50-500 ms) comes well before the end,
    # even on a machine busy with other tests
    items = [{"prompt": f"ttft=50 itl=400 h{i}", "max_tokens": 6} for i in range(20)]
    rc, result = soak(
        stub_url, tmp_path, items, "--hangup-fraction", "1", "--max-concurrency", "20"
    )
    assert rc == 0  # no normal request, but every hang-up happened
    run = result["runs"][0]
    tally = run["soak"]["tally"]
    assert tally["sent"] == {"hangup": 20}
    assert (tally["hangups"], tally["hangups_late"]) == (20, 0)
    assert run["soak"]["errors_by_kind"] == {}
    assert run["requests"] == [] and run["summary"]["completed"] == 0
    # The server saw answers cut, streamed and not, and sent none in full. (A cut the server
    # cannot see, on a busy machine: a stream hung up on before its first chunk was made,
    # or a request cut before it arrived; the client counted every one, above.)
    assert wait_for(lambda: stub.cut_streams + stub.cut_plain >= 15), (
        stub.cut_streams,
        stub.cut_plain,
    )
    # Let every request that reached the server end, cut or answered (bounded), then: none
    # was answered in full.
    wait_for(lambda: stub.cut_streams + stub.cut_plain + stub.answered >= len(stub.bodies))
    assert stub.answered == 0
    assert stub.cut_streams > 0 and stub.cut_plain > 0
    plain = [b for b in stub.bodies if b["stream"] is False]
    assert len(plain) == stub.cut_plain and all("stream_options" not in b for b in plain)
    assert run["summary"]["duration"] < 2.0  # nobody waited for a whole answer


def test_a_hangup_due_after_the_answer_counts_as_late(stub, stub_url, tmp_path):
    items = [{"prompt": "ttft=10 itl=5", "max_tokens": 1}] * 6  # one token: nothing to cut
    rc, result = soak(stub_url, tmp_path, items, "--hangup-fraction", "1", "--seed", "3")
    tally = result["runs"][0]["soak"]["tally"]
    # streamed: cut after 1 or 2 text chunks, so a one-token answer may end first
    assert tally["hangups"] + tally["hangups_late"] == 6 and tally["hangups_late"] >= 1


def test_invalid_bodies_count_only_a_4xx_with_an_error_object(stub, stub_url, tmp_path):
    items = [{"prompt": "ttft=10 itl=5", "max_tokens": 2}] * 24
    flags = ("--invalid-fraction", "1", "--max-concurrency", "8")
    rc, result = soak(stub_url, tmp_path, items, *flags)
    assert rc == 0
    soak_block = result["runs"][0]["soak"]
    tally = soak_block["tally"]
    assert tally["sent"] == {"invalid": 24} and stub.invalid_seen == 24
    assert (tally["invalid_ok"], tally["invalid_failed"]) == (24, 0)
    assert set(tally["invalid_statuses"]) == {"400", "404"}  # 404: the unknown model
    assert stub.bodies == []  # no invalid body got through the stub's checks

    stub.invalid_answer = "detail"  # a 422 without an OpenAI error object
    rc, result = soak(stub_url, tmp_path, items, *flags)
    assert rc == 1  # nothing was answered as it should be
    tally = result["runs"][0]["soak"]["tally"]
    assert (tally["invalid_ok"], tally["invalid_failed"]) == (0, 24)
    errors = result["runs"][0]["soak"]["errors_by_kind"]
    assert sum(errors.values()) == 24
    assert all(k.endswith("HTTP 422 without an error object") for k in errors)

    stub.invalid_answer = "500"  # an error object, but a server error
    rc, result = soak(stub_url, tmp_path, items, *flags)
    errors = result["runs"][0]["soak"]["errors_by_kind"]
    assert sum(errors.values()) == 24 and all(k.endswith(": HTTP 500") for k in errors)


def test_a_mixed_run_splits_the_kinds_by_the_fractions(stub, stub_url, tmp_path):
    items = [{"prompt": "ttft=20 itl=30 m", "max_tokens": 4}] * 60
    rc, result = soak(stub_url, tmp_path, items, "--hangup-fraction", "0.25",
                      "--invalid-fraction", "0.25", "--max-concurrency", "12")  # fmt: skip
    assert rc == 0
    run = result["runs"][0]
    sent = run["soak"]["tally"]["sent"]
    assert sum(sent.values()) == 60 and all(5 <= sent[k] <= 25 for k in ("hangup", "invalid"))
    assert run["summary"]["completed"] == sent["normal"] == len(run["requests"])
    assert run["soak"]["tally"]["invalid_ok"] == sent["invalid"]


def test_health_non_200_is_counted(stub, stub_url, tmp_path):
    stub.health_status = 503
    items = [{"prompt": "ttft=20 itl=10", "max_tokens": 2}]
    rc, result = soak(stub_url, tmp_path, items, "--duration", "0.6", "--max-concurrency", "1",
                      "--health-interval", "0.2")  # fmt: skip
    health = result["runs"][0]["soak"]["health"]
    assert health["probes"] >= 3 and health["non_200"] == health["probes"]
    assert health["non_200_by_kind"] == {"503": health["probes"]}


def test_server_pid_reads_the_rss_of_the_process_and_its_children(stub, stub_url, tmp_path):
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        items = [{"prompt": "ttft=20 itl=10", "max_tokens": 2}]
        rc, result = soak(stub_url, tmp_path, items, "--duration", "0.7", "--max-concurrency",
                          "1", "--server-pid", str(os.getpid()), "--rss-interval", "0.2")  # fmt: skip
    finally:
        child.kill()
        child.wait()
    assert rc == 0
    rss = result["runs"][0]["soak"]["rss"]
    assert rss["pid"] == os.getpid() and len(rss["samples"]) >= 4  # start, ~3 ticks, end
    first = rss["samples"][0]["processes"]
    assert str(child.pid) in first and str(os.getpid()) in first
    assert first[str(child.pid)] > 1  # MiB: a Python interpreter
    assert rss["samples"][0]["total_mb"] == pytest.approx(sum(first.values()))
    assert rss["start_mb"] > first[str(child.pid)] and rss["max_mb"] >= rss["end_mb"]
    assert "time.sleep(60)" in rss["names"][str(child.pid)]


@pytest.mark.parametrize("kind", INVALID_KINDS)
@pytest.mark.parametrize("chat", [False, True])
def test_each_invalid_body_is_invalid(kind, chat):
    raw = invalid_body(kind, "m", chat)
    if kind == "malformed_json":
        with pytest.raises(json.JSONDecodeError):
            json.loads(raw)
        return
    body = json.loads(raw)
    if kind == "not_an_object":
        assert isinstance(body, list)
        return
    key = "messages" if chat else "prompt"
    wrong = {
        "wrong_types": body.get("max_tokens") == "eight" and isinstance(body.get(key), dict),
        "negative_max_tokens": body.get("max_tokens") == -5,
        "unknown_model": body["model"] != "m",
        "bad_temperature": body.get("temperature") == -1.0,
        "zero_n": body.get("n") == 0,
        "missing_input": key not in body,
    }
    assert wrong[kind]


def test_error_object_shape():
    assert is_error_object(b'{"error": {"message": "bad", "type": "invalid_request_error"}}')
    assert not is_error_object(b'{"detail": "bad"}')
    assert not is_error_object(b'{"error": "bad"}')
    assert not is_error_object(b'{"error": {"message": "bad"}}')
    assert not is_error_object(b"<html>bad</html>")
