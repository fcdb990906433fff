"""`cadence serve` on the GPU, spoken to by the `openai` client: the path a GPU user gets by
default (CUDA graphs, Triton attention, async scheduling, grammar masks on the device).

    python benchmarks/gpu_serve_check.py MODEL_DIR [--load-format dummy]

MODEL_DIR needs config.json and a tokenizer (tokenizer.json, tokenizer_config.json, a chat
template); with --load-format dummy no weights (the H200 has no hub: the folder cadence
converts SmolLM2's GGUF into, minus model.safetensors, serves). With random weights the
text is noise, so what is checked is the protocol, not the words: every request answers,
streamed text equals the non-streamed text at temperature 0, a JSON schema's answer parses
and validates, n=2 gives two choices, 64 concurrent chats all finish, /metrics counts them,
and nothing is left running. Exits non-zero on the first failure.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import os
import signal
import socket
import subprocess
import sys
import time

import httpx


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _check(ok: bool, what: str) -> None:
    print(("ok   " if ok else "FAIL ") + what, flush=True)
    if not ok:
        raise SystemExit(1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model")
    ap.add_argument("--load-format", default="dummy")
    ap.add_argument("--dtype", default="bfloat16")
    args = ap.parse_args()
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    cmd = [sys.executable, "-m", "cadence.cli.main", "serve", args.model, "--port", str(port)]
    cmd += ["--load-format", args.load_format, "--dtype", args.dtype, "--max-model-len", "4096"]
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, env=os.environ.copy())
    try:
        while True:
            if proc.poll() is not None:
                _check(False, f"server exited with {proc.returncode} before it was ready")
            try:
                if httpx.get(url + "/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() - t0 > 300:
                _check(False, "server ready within 300 s")
            time.sleep(0.2)
        print(f"server ready in {time.monotonic() - t0:.1f} s", flush=True)
        _exercise(url)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            _check(False, "server stopped within 30 s of SIGTERM")
    # uvicorn shuts down gracefully, then re-raises the signal: -15 is a clean exit here.
    _check(proc.returncode in (0, -signal.SIGTERM), f"server exited ({proc.returncode})")
    _check(not _engine_processes(), "no engine process left behind")


def _engine_processes() -> list[str]:
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if b"cadence::engine" in f.read():
                    found.append(pid)
        except OSError:
            pass
    return found


def _exercise(url: str) -> None:
    from openai import OpenAI

    client = OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=120)
    model = client.models.list().data[0].id
    chat = [{"role": "user", "content": "Tell me about the sea."}]

    whole = client.chat.completions.create(model=model, messages=chat, temperature=0, max_tokens=64)
    _check(whole.usage.completion_tokens > 0, f"chat: {whole.usage.completion_tokens} tokens")
    text = ""
    for chunk in client.chat.completions.create(
        model=model, messages=chat, temperature=0, max_tokens=64, stream=True
    ):
        if chunk.choices:
            text += chunk.choices[0].delta.content or ""
    _check(text == whole.choices[0].message.content, "streamed text equals non-streamed")

    schema = {
        "type": "object",
        "properties": {
            "city": {"type": "string", "maxLength": 12},
            "year": {"type": "integer", "minimum": 0, "maximum": 3000},
            "sunny": {"type": "boolean"},
        },
        "required": ["city", "year", "sunny"],
        "additionalProperties": False,
    }
    out = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "A city, a year and the weather, as JSON."}],
        max_tokens=200,
        n=2,
        temperature=0.8,
        response_format={"type": "json_schema", "json_schema": {"name": "w", "schema": schema}},
    )
    _check(len(out.choices) == 2, "n=2 gives two choices")
    for c in out.choices:
        import jsonschema

        value = json.loads(c.message.content)
        jsonschema.validate(value, schema)
        _check(True, f"json_schema answer validates: {c.message.content}")

    def one(i: int) -> int:
        r = client.chat.completions.create(
            model=model,
            messages=[{"role": "user", "content": f"Question {i}: say something."}],
            max_tokens=32 + i % 64,
            temperature=0.7,
            seed=i,
            extra_body={"ignore_eos": True},
        )
        return r.usage.completion_tokens

    t = time.monotonic()
    with cf.ThreadPoolExecutor(64) as pool:
        tokens = list(pool.map(one, range(64)))
    _check(
        tokens == [32 + i % 64 for i in range(64)],
        f"64 concurrent chats finished, {sum(tokens)} tokens in {time.monotonic() - t:.2f} s",
    )

    bad = httpx.post(url + "/v1/chat/completions", json={"model": model, "messages": "no"})
    _check(
        bad.status_code == 400 and "error" in bad.json(),
        f"bad input -> {bad.status_code} error object",
    )
    metrics = httpx.get(url + "/metrics").text
    running = sum(
        float(line.rsplit(" ", 1)[1])
        for line in metrics.splitlines()
        if line.startswith("cadence:num_requests_running")
    )
    _check(running == 0, "/metrics: nothing running after the last answer")


if __name__ == "__main__":
    main()
