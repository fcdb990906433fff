"""The API side's CPU per streamed token (issue 37): serve a tiny random model (2 layers,
SmolLM2's tokenizer: engine steps of a few ms, so the API process is what is measured),
stream `cadence bench serve` through it (random prompts, EOS ignored), and read the
`cadence::api` process's CPU time (user + system, from /proc) before and after.

    python benchmarks/api_cpu.py --concurrency 64 --input-len 128 --output-len 256 \
        --num-prompts 256 --json out.json

Prints CPU-ms per 1,000 streamed tokens (the API process only: the engine is its child
and is not counted) and the client's throughput.
"""

from __future__ import annotations

import argparse
import json
import os
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


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--input-len", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=256)
    ap.add_argument("--num-prompts", type=int, default=256)
    ap.add_argument("--endpoint", default="completions")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    work = tempfile.mkdtemp(prefix="api-cpu-")
    model = tiny_model(os.path.join(work, "tiny"))
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "cadence.cli.main", "serve", "--model", model, "--port",
         str(port), "--max-num-seqs", str(args.concurrency), "--max-num-waiting", "4096",
         "--kv-cache-memory", str(256 * 2**20), "--log-level", "warning"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            try:
                if httpx.get(url + "/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.2)
        bench = [
            sys.executable, "-m", "cadence.cli.main", "bench", "serve", "--base-url", url,
            "--endpoint", args.endpoint, "--dataset-name", "random",
            "--random-input-len", str(args.input_len), "--random-output-len",
            str(args.output_len), "--num-prompts", str(args.num_prompts),
            "--max-concurrency", str(args.concurrency), "--ignore-eos",
            "--save-json", os.path.join(work, "bench.json"),
        ]  # fmt: skip
        warm = [*bench[:-2], "--num-prompts", str(args.concurrency)]
        subprocess.run(warm, check=True, stdout=subprocess.DEVNULL)
        cpu0, t0 = cpu_seconds(server.pid), time.monotonic()
        subprocess.run(bench, check=True, stdout=subprocess.DEVNULL)
        cpu1, t1 = cpu_seconds(server.pid), time.monotonic()
        with open(os.path.join(work, "bench.json")) as f:
            report = json.load(f)
        tokens = args.num_prompts * args.output_len
        result = {
            "concurrency": args.concurrency,
            "streamed_tokens": tokens,
            "api_cpu_s": cpu1 - cpu0,
            "wall_s": t1 - t0,
            "api_cpu_ms_per_1000_tokens": 1000 * (cpu1 - cpu0) / tokens * 1000,
            "output_tok_s": report["runs"][0]["summary"]["output_throughput"],
            "itl_p99_ms": report["runs"][0]["summary"].get("p99_itl_ms"),
        }
        print(json.dumps(result))
        if args.json:
            with open(args.json, "w") as f:
                json.dump(result, f, indent=1)
    finally:
        server.terminate()
        server.wait(30)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
