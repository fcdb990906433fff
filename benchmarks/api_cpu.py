"""The serving path's cost and speed (issue 37): serve a model, stream `cadence bench serve`
through it (random prompts, EOS ignored) at each concurrency, and read the API processes'
CPU time (user + system, from /proc: the server process and its `cadence::api*` children;
the engine is not counted) before and after each run.

    python benchmarks/api_cpu.py --concurrency 64 --input-len 128 --output-len 256 \
        --num-prompts 256 --json out.json
    python benchmarks/api_cpu.py --model .gpu-smoke/llama8b --serve-args "--load-format dummy \
        --dtype bfloat16" --api-server-count 1,2,4 --concurrency 1,64,256,512 --json out.json

Without --model: a tiny random model (2 layers, SmolLM2's tokenizer: engine steps of a few
ms, so the API side is what is measured). Prints, per server and concurrency, CPU-ms per
1,000 streamed tokens, the client's output tok/s, TTFT, TPOT and ITL.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile
import time

import httpx


def tiny_model(out: str) -> str:
    """2 layers over SmolLM2's tokenizer (its 49,152-token vocabulary)."""
    import torch
    import transformers as tf

    from cadence.loader.model_path import resolve_model_path

    src = resolve_model_path(None)
    config = tf.LlamaConfig(
        vocab_size=49152, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048,
        tie_word_embeddings=True,
    )  # fmt: skip
    torch.manual_seed(0)
    tf.LlamaForCausalLM(config).eval().save_pretrained(out)
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        if os.path.exists(f"{src}/{name}"):
            shutil.copy(f"{src}/{name}", f"{out}/{name}")
    return out


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of one process (not its children)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def api_pids(server_pid: int) -> list[int]:
    """The server process and its API process children (not the engine, not its workers)."""
    pids = [server_pid]
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmd = f.read()
        except OSError:
            continue
        if ppid == server_pid and cmd.startswith(b"cadence::api"):
            pids.append(int(entry))
    return pids


def api_cpu(pids: list[int]) -> float:
    return sum(cpu_seconds(p) for p in pids)


def children_cpu() -> float:
    """User + system CPU of this process's finished children (the benchmark clients)."""
    import resource

    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]


def serve(model: str, count: int, args) -> tuple[subprocess.Popen, str]:
    port = free_port()
    log_path = os.path.join(args.work, f"server-{count}.log")
    with open(log_path, "w") as log:  # (the server keeps its own handle)
        server = subprocess.Popen(
            [sys.executable, "-m", "cadence.cli.main", "serve", "--model", model, "--port",
             str(port), "--max-num-seqs", str(max(ints(args.concurrency))), "--max-num-waiting",
             "4096", "--api-server-count", str(count), *shlex.split(args.serve_args)],
            stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 900
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise RuntimeError(f"the server exited ({server.returncode}): see {log_path}")
        try:
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                return server, url
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise TimeoutError("the server did not start")


def itl_tail(run: dict) -> dict:
    """Where the long gaps between a stream's chunks (over 3x the median TPOT) fall: at
    which of a request's chunks, and when in the run (seconds from its first request)."""
    limit = 3 * run["summary"]["median_tpot_ms"] / 1e3
    requests = [q for q in run["requests"] if q["success"]]
    t0 = min((q["start_s"] for q in requests), default=0.0)
    gaps, by_chunk, by_time = 0, {"1-8": 0, "9-64": 0, "65+": 0}, {}
    for q in requests:
        t = q["start_s"] + q["ttft_s"]
        for i, gap in enumerate(q["itl_s"], start=1):
            t += gap
            gaps += 1
            if gap <= limit:
                continue
            by_chunk["1-8" if i <= 8 else "9-64" if i <= 64 else "65+"] += 1
            second = f"{int((t - t0) * 2) / 2:.1f}"
            by_time[second] = by_time.get(second, 0) + 1
    long = sum(by_chunk.values())
    chunks = gaps + len(requests)
    return {
        "tokens_per_chunk": round(sum(q["output_tokens"] for q in requests) / max(1, chunks), 3),
        "limit_ms": round(limit * 1e3, 2),
        "long_gaps": long,
        "long_gaps_pct": round(100 * long / max(1, gaps), 3),
        "by_chunk": by_chunk,
        "by_half_second": by_time,
    }


def last_step_id(url: str) -> int:
    steps = httpx.get(url + "/v1/engine/steps?limit=1", timeout=30).json()["steps"]
    return steps[-1]["id"] if steps else 0


def step_summary(url: str, since: int) -> dict:
    """The engine's steps since step `since` (its timeline): how long a step took with and
    without prompt tokens in it, and the longest. A decoding stream's inter-token gap is at
    least the step it waited for."""
    steps = httpx.get(url + f"/v1/engine/steps?since={since}&limit=100000", timeout=60).json()
    from cadence.engine.step_timeline import PHASES

    steps = steps["steps"]

    def ms(step: dict) -> float:
        return sum(step[f"{p}_ms"] for p in PHASES)

    def mean(xs: list[float]) -> float | None:
        return round(sum(xs) / len(xs), 2) if xs else None

    mixed = [ms(s) for s in steps if s["prefill_tokens"] and s["decode_seqs"]]
    decode = [ms(s) for s in steps if not s["prefill_tokens"]]
    every = sorted(ms(s) for s in steps)
    return {
        "steps": len(steps),
        "steps_with_prefill_and_decodes": len(mixed),
        "step_ms_p50": every[len(every) // 2] if every else None,
        "step_ms_p99": every[int(len(every) * 0.99)] if every else None,
        "step_ms_max": every[-1] if every else None,
        "decode_step_ms_mean": mean(decode),
        "mixed_step_ms_mean": mean(mixed),
        "max_prefill_tokens_beside_decodes": max(
            (s["prefill_tokens"] for s in steps if s["decode_seqs"]), default=0
        ),
        "mixed_step_ms_by_prefill_tokens": mixed_by_size(steps, ms),
    }


def mixed_by_size(steps: list[dict], ms) -> dict:
    """Steps with prompt tokens and decodes, by how many prompt tokens: count, mean ms
    (what a decoding stream waits for a step that carries a prefill chunk of that size)."""
    edges = (512, 1024, 2048, 4096, 8192, 1 << 30)
    groups: dict[str, list[float]] = {}
    for s in steps:
        if s["prefill_tokens"] and s["decode_seqs"]:
            top = next(e for e in edges if s["prefill_tokens"] <= e)
            groups.setdefault(f"<={top}" if top < 1 << 30 else ">8192", []).append(ms(s))
    return {k: [len(v), round(sum(v) / len(v), 2)] for k, v in groups.items()}


def measure(url: str, pids: list[int], c: int, args) -> dict:
    n = args.num_prompts or max(8, 2 * c)
    out = os.path.join(args.work, "bench.json")
    bench = [
        sys.executable, "-m", "cadence.cli.main", "bench", "serve", "--base-url", url,
        "--endpoint", args.endpoint, "--dataset-name", "random",
        "--random-input-len", str(args.input_len), "--random-output-len",
        str(args.output_len), "--max-concurrency", str(c), "--ignore-eos",
    ]  # fmt: skip
    warm = [*bench, "--num-prompts", str(max(c, 4))]
    subprocess.run(warm, check=True, stdout=subprocess.DEVNULL)
    step0 = last_step_id(url) if args.steps else 0
    cpu0, t0, client0 = api_cpu(pids), time.monotonic(), children_cpu()
    subprocess.run([*bench, "--num-prompts", str(n), "--save-json", out], check=True,
                   stdout=subprocess.DEVNULL)  # fmt: skip
    cpu1, t1, client1 = api_cpu(pids), time.monotonic(), children_cpu()
    with open(out) as f:
        run = json.load(f)["runs"][0]
    s = run["summary"]
    tokens = s["total_output_tokens"]
    return {
        "concurrency": c,
        "num_prompts": n,
        "streamed_tokens": tokens,
        "api_processes": len(pids) - (len(pids) > 1),
        "api_cpu_s": round(cpu1 - cpu0, 3),
        "wall_s": round(t1 - t0, 3),
        "client_cpu_s": round(client1 - client0, 3),  # the benchmark client's own CPU
        "api_cpu_ms_per_1000_tokens": round(1e6 * (cpu1 - cpu0) / max(1, tokens), 2),
        "output_tok_s": round(s["output_throughput"], 1),
        "ttft_p50_ms": s.get("median_ttft_ms"),
        "ttft_p99_ms": s.get("p99_ttft_ms"),
        "tpot_p50_ms": s.get("median_tpot_ms"),
        "itl_p50_ms": s.get("median_itl_ms"),
        "itl_p99_ms": s.get("p99_itl_ms"),
        "failed": s["failed"],
        "itl_tail": itl_tail(run),
        **({"engine_steps": step_summary(url, step0)} if args.steps else {}),
        # the step pacer's state at the run's end: its cap on prompt tokens beside decodes
        "scheduler": httpx.get(url + "/v1/engine/stats", timeout=30).json().get("scheduler"),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None, help="(default: a tiny random model)")
    ap.add_argument("--serve-args", default="--kv-cache-memory 268435456 --log-level warning")
    ap.add_argument("--api-server-count", default="1", help="comma-separated: a server each")
    ap.add_argument("--concurrency", default="64", help="comma-separated")
    ap.add_argument("--input-len", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=256)
    ap.add_argument("--num-prompts", type=int, default=0, help="(default: 2 x concurrency, >= 8)")
    ap.add_argument("--endpoint", default="completions")
    ap.add_argument("--steps", action="store_true", help="summarise the engine's steps too")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    args.work = tempfile.mkdtemp(prefix="api-cpu-")
    model = args.model or tiny_model(os.path.join(args.work, "tiny"))
    results = []
    try:
        for count in ints(args.api_server_count):
            server, url = serve(model, count, args)
            try:
                time.sleep(1.0)  # (the API processes' children are listed once started)
                pids = api_pids(server.pid)
                for c in ints(args.concurrency):
                    row = {"api_server_count": count, **measure(url, pids, c, args)}
                    print(json.dumps(row), flush=True)
                    results.append(row)
            finally:
                server.terminate()
                server.wait(60)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(results, f, indent=1)
    finally:
        shutil.rmtree(args.work, ignore_errors=True)


if __name__ == "__main__":
    main()
