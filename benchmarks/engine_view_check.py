"""The engine view's data on a real server, under load (issue 19): where each step's time
goes, and a profiler trace, on whatever device `cadence serve` picks.

    python benchmarks/engine_view_check.py MODEL_DIR [--concurrency 32] [--seconds 20]
        [--json PATH] [-- extra `cadence serve` flags, e.g. --load-format dummy]

Starts `cadence serve MODEL_DIR --profile-dir DIR`, keeps `--concurrency` streamed chats in
flight for `--seconds`, profiles two seconds of it, then reads /v1/engine/steps and
/v1/engine/stats: prints the median phase times of the steps under load, the batch, the
trace's size and its counts of `cadence::step` ranges and of GPU kernels. Exits non-zero if
an endpoint misbehaves.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time

import httpx

PHASES = ("schedule", "prepare", "forward", "sample", "output")


def _stream(url: str, stop: threading.Event, errors: list) -> None:
    body = {
        "messages": [{"role": "user", "content": "Write a long story about a lighthouse."}],
        "max_tokens": 256,
        "ignore_eos": True,
        "stream": True,
    }
    with httpx.Client(base_url=url, timeout=120) as c:
        while not stop.is_set():
            try:
                with c.stream("POST", "/v1/chat/completions", json=body) as r:
                    for _ in r.iter_lines():
                        if stop.is_set():
                            break
            except httpx.HTTPError as e:
                errors.append(repr(e))
                return


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model")
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--port", type=int, default=8377)
    ap.add_argument("--json", metavar="PATH")
    argv = sys.argv[1:]
    cut = argv.index("--") if "--" in argv else len(argv)
    args = ap.parse_args(argv[:cut])
    extra = argv[cut + 1 :]  # for `cadence serve`
    url = f"http://127.0.0.1:{args.port}"
    prof_dir = tempfile.mkdtemp(prefix="cadence-prof-")
    cmd = [sys.executable, "-m", "cadence.cli.main", "serve", args.model]
    cmd += ["--port", str(args.port), "--profile-dir", prof_dir, *extra]
    server = subprocess.Popen(cmd)
    result: dict = {}
    try:
        for _ in range(1200):
            try:
                if httpx.get(url + "/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if server.poll() is not None:
                raise SystemExit(f"server exited with {server.returncode}")
            time.sleep(0.5)
        http = httpx.Client(base_url=url, timeout=300)
        stop, errors = threading.Event(), []
        workers = [
            threading.Thread(target=_stream, args=(url, stop, errors))
            for _ in range(args.concurrency)
        ]
        for w in workers:
            w.start()
        time.sleep(args.seconds / 2)
        first = http.get("/v1/engine/steps", params={"limit": 1}).json()["num_steps"]
        started = http.post("/start_profile").json()
        time.sleep(2.0)
        t0 = time.perf_counter()
        trace = http.post("/stop_profile").json()
        result["trace_write_s"] = round(time.perf_counter() - t0, 2)
        time.sleep(args.seconds / 2)
        steps = http.get("/v1/engine/steps", params={"since": first, "limit": 100_000}).json()
        table = http.get("/v1/engine/requests").json()
        stats = http.get("/v1/engine/stats").json()
        stop.set()
        for w in workers:
            w.join(120)
        assert not errors, errors[:3]
        load = [s for s in steps["steps"] if s["decode_seqs"] >= args.concurrency // 2]
        assert load, "no steps under load"
        result["activities"] = started["activities"]
        result["steps_under_load"] = len(load)
        result["median_ms"] = {
            p: round(statistics.median(s[f"{p}_ms"] for s in load), 4) for p in PHASES
        }
        result["median_step_ms"] = round(sum(result["median_ms"].values()), 4)
        result["median_batch"] = statistics.median(s["num_seqs"] for s in load)
        result["requests_in_table"] = table["total"]
        result["stats"] = {k: stats[k] for k in ("num_steps", "requests", "tokens", "kv_cache")}
        with gzip.open(trace["trace"]) as f:
            events = json.load(f)["traceEvents"]
        result["trace_mb"] = round(os.path.getsize(trace["trace"]) / 2**20, 2)
        result["trace_steps"] = sum(e.get("name") == "cadence::step" for e in events)
        result["trace_kernels"] = sum(e.get("cat") == "kernel" for e in events)
        assert result["trace_steps"] > 0, "no cadence::step ranges in the trace"
        print(json.dumps(result, indent=1))
        if args.json:
            with open(args.json, "w") as f:
                json.dump(result, f, indent=1)
    finally:
        server.terminate()
        server.wait(60)


if __name__ == "__main__":
    main()
