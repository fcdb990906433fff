"""How fast prompt K/V moves from a prefill engine to a decode engine, per connector.

For each connector: a prefill server, a decode server and `cadence router --prefill
--decode` (all on this machine), then long prompts one at a time, each new (no cache hit):

    prefill alone    time to the first token of the prompt on the prefill engine alone
    PD               time to the first token through the router (prefill + move + the
                     decode engine's step of the last prompt token)
    load             the decode engine's own count (cadence:kv_transfer_load_seconds /
                     _loads: from the start of a load to its end, as its scheduler saw it),
                     and the bytes it moved (tokens x the model's K/V bytes per token)

    python benchmarks/kv_transfer_bench.py MODEL --connectors tcp,shm,cuda_ipc \\
        --prompt-len 8000 --reps 5 --out build/kv_transfer.json -- --load-format dummy ...

Everything after `--` goes to both `cadence serve` commands. GPU placement comes from the
environment: PREFILL_GPUS / DECODE_GPUS (CUDA_VISIBLE_DEVICES of each; default 0 and 0).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import subprocess
import sys
import time

import httpx

CLI = [sys.executable, "-m", "cadence.cli.main"]


def wait_healthy(url: str, proc: subprocess.Popen, timeout: float = 900) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args[:4]} exited with {proc.returncode}")
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise TimeoutError(f"nothing healthy at {url}")


def ttft(url: str, prompt: list[int], max_tokens: int = 2) -> float:
    body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": True}
    t0 = time.perf_counter()
    with httpx.stream("POST", url + "/v1/completions", json=body, timeout=300) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if line.startswith("data: {"):
                return time.perf_counter() - t0
    raise RuntimeError("no token came back")


def kv_bytes_per_token(model: str, dtype_bytes: int) -> int:
    with open(os.path.join(model, "config.json")) as f:
        c = json.load(f)
    heads = c.get("num_key_value_heads", c["num_attention_heads"])
    head_dim = c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"]
    return c["num_hidden_layers"] * 2 * heads * head_dim * dtype_bytes  # K and V


def one_connector(args, connector: str, serve: list[str], log_dir: str) -> dict:
    ports = {"prefill": 8601, "decode": 8602}
    gpus = {
        "prefill": os.environ.get("PREFILL_GPUS", "0"),
        "decode": os.environ.get("DECODE_GPUS", "0"),
    }
    procs = []
    logs = contextlib.ExitStack()
    try:
        for role in ("prefill", "decode"):  # one at a time: each profiles GPU memory
            cmd = [*CLI, "serve", args.model, *serve, "--kv-role", role]
            cmd += ["--kv-connector", connector, "--port", str(ports[role])]
            log_path = os.path.join(log_dir, f"kv_{connector}_{role}.log")
            log = logs.enter_context(open(log_path, "w"))  # noqa: SIM115 (open while it runs)
            env = {**os.environ, "CUDA_VISIBLE_DEVICES": gpus[role]}
            procs.append(subprocess.Popen(cmd, stdout=log, stderr=log, env=env))
            wait_healthy(f"http://127.0.0.1:{ports[role]}", procs[-1])
        cmd = [*CLI, "router", "--port", "8600", "--prefill", "http://127.0.0.1:8601"]
        cmd += ["--decode", "http://127.0.0.1:8602"]
        procs.append(subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        wait_healthy("http://127.0.0.1:8600", procs[-1])
        rng = random.Random(connector)

        def prompt() -> list[int]:
            return [rng.randrange(100, args.vocab) for _ in range(args.prompt_len)]

        ttft("http://127.0.0.1:8601", prompt())  # warm-up of each path
        ttft("http://127.0.0.1:8600", prompt())
        alone = [ttft("http://127.0.0.1:8601", prompt()) for _ in range(args.reps)]
        stats = "http://127.0.0.1:8602/v1/engine/stats"
        before = httpx.get(stats).json()["kv_transfer"]
        pd = [ttft("http://127.0.0.1:8600", prompt()) for _ in range(args.reps)]
        after = httpx.get(stats).json()["kv_transfer"]
    finally:
        for p in reversed(procs):
            p.terminate()
        for p in procs:
            p.wait(60)
        logs.close()
    loads = after["loads"] - before["loads"]
    seconds = after["load_seconds"] - before["load_seconds"]
    tokens = after["loaded_tokens"] - before["loaded_tokens"]
    nbytes = tokens * kv_bytes_per_token(args.model, args.kv_dtype_bytes)
    return {
        "connector": connector,
        "prompt_len": args.prompt_len,
        "reps": args.reps,
        "prefill_alone_ttft_s": sorted(alone)[len(alone) // 2],
        "pd_ttft_s": sorted(pd)[len(pd) // 2],
        "loads": loads,
        "failed_loads": after["failed_loads"] - before["failed_loads"],
        "load_s_mean": seconds / loads if loads else None,
        "bytes_per_load": nbytes / loads if loads else None,
        "gb_per_s": nbytes / seconds / 1e9 if seconds else None,
    }


def main() -> None:
    argv = sys.argv[1:]
    serve = argv[argv.index("--") + 1 :] if "--" in argv else []
    argv = argv[: argv.index("--")] if "--" in argv else argv
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("model")
    p.add_argument("--connectors", default="tcp,shm,cuda_ipc")
    p.add_argument("--prompt-len", type=int, default=8000)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--vocab", type=int, default=32000, help="prompt token ids below this")
    p.add_argument("--kv-dtype-bytes", type=int, default=2, help="2: bf16/fp16 K/V")
    p.add_argument("--out", default="build/kv_transfer.json")
    args = p.parse_args(argv)
    log_dir = os.path.dirname(os.path.abspath(args.out))
    os.makedirs(log_dir, exist_ok=True)
    rows = []
    for connector in args.connectors.split(","):
        try:
            rows.append(one_connector(args, connector, serve, log_dir))
        except Exception as e:  # report it, go on with the next connector
            rows.append({"connector": connector, "error": f"{type(e).__name__}: {e}"})
        print(json.dumps(rows[-1]), flush=True)
    with open(args.out, "w") as f:
        json.dump(rows, f, indent=1)
    print(
        f"{'connector':<10} {'alone TTFT':>11} {'PD TTFT':>9} {'load':>9} {'MB/load':>8} {'GB/s':>6}"
    )
    for r in rows:
        if "error" in r:
            print(f"{r['connector']:<10} {r['error']}")
            continue
        load = r["load_s_mean"] or 0.0
        print(
            f"{r['connector']:<10} {r['prefill_alone_ttft_s'] * 1e3:9.1f}ms "
            f"{r['pd_ttft_s'] * 1e3:7.1f}ms {load * 1e3:7.1f}ms "
            f"{(r['bytes_per_load'] or 0) / 1e6:8.1f} {r['gb_per_s'] or 0:6.2f}"
        )


if __name__ == "__main__":
    main()
