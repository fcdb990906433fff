"""What the CPU server's processes hold besides the KV pool (issue 38's memory bound).

    .venv/bin/python benchmarks/cpu_engine_rss.py [--kv MiB] [--server-arg=--quantization=none ...]

Starts `cadence serve` (the default GGUF model) with a `--kv` MiB pool (default 128), sends
one completion (128 prompt tokens -> 128, EOS ignored), waits until it is done, then reads
each process's VmRSS (resident now) and VmHWM (its peak) from /proc, and states the engine's
figures less the pool. Then 16 concurrent requests, and the same figures again.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import subprocess
import sys
import time

import httpx

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from cadence.bench.soak import process_name, process_tree  # noqa: E402

PORT = 8777


def status_mb(pid: int, field: str) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    raise ValueError(f"{field} missing for {pid}")


def report(root: int, pool_mb: float, when: str) -> None:
    print(f"-- {when}")
    for pid in process_tree(root):
        name = process_name(pid)
        rss, peak = status_mb(pid, "VmRSS"), status_mb(pid, "VmHWM")
        line = f"   {pid:7d} RSS {rss:6.0f} MiB, peak {peak:6.0f} MiB  {name[:60]}"
        if "engine" in name:  # its figures less the pool
            line += f"  (besides the pool: {rss - pool_mb:.0f} now, {peak - pool_mb:.0f} peak)"
        print(line)


async def complete(client: httpx.AsyncClient, model: str, seed: int) -> None:
    prompt = [(seed * 7919 + i * 104729) % 40000 + 100 for i in range(128)]
    body = {"model": model, "prompt": prompt, "max_tokens": 128, "ignore_eos": True}
    r = await client.post(f"http://127.0.0.1:{PORT}/v1/completions", json=body)
    r.raise_for_status()


async def drive(concurrency: int) -> None:
    async with httpx.AsyncClient(timeout=600) as client:
        model = (await client.get(f"http://127.0.0.1:{PORT}/v1/models")).json()["data"][0]["id"]
        await asyncio.gather(*(complete(client, model, i) for i in range(concurrency)))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kv", type=int, default=128, help="KV pool, MiB")
    ap.add_argument("--server-arg", action="append", default=[])
    args = ap.parse_args()
    cmd = [sys.executable, "-m", "cadence.cli.main", "serve", "--port", str(PORT)]
    cmd += ["--kv-cache-memory", f"{args.kv}MiB", *args.server_arg]
    server = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(600):
            try:
                if httpx.get(f"http://127.0.0.1:{PORT}/health").status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        report(server.pid, args.kv, "started")
        asyncio.run(drive(1))
        time.sleep(1)
        report(server.pid, args.kv, "after one request")
        asyncio.run(drive(16))
        time.sleep(1)
        report(server.pid, args.kv, "after 16 concurrent requests")
    finally:
        server.send_signal(signal.SIGINT)
        server.wait(timeout=60)


if __name__ == "__main__":
    main()
