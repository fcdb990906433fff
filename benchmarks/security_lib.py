"""What benchmarks/security_attacks.py needs around its attacks: servers of one checkout,
the sockets a process tree listens on (read from /proc, as any local user can), a pickle
that runs code, a fake prefill engine, a raw upload."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import zmq

KEY = "attack-test-key"
SECRET = "attack-test-kv-secret-0123456789"
CPU = ["--device", "cpu", "--dtype", "float32", "--max-model-len", "256"]
CPU += ["--num-gpu-blocks-override", "128"]


def has_flag(checkout: str, flag: str) -> bool:
    """Whether that checkout's `cadence serve` knows `flag` (the older one may not)."""
    env = {**os.environ, "PYTHONPATH": checkout}
    cmd = [sys.executable, "-m", "cadence.cli.main", "serve", "--help"]
    return flag in subprocess.run(cmd, env=env, cwd=checkout, capture_output=True, text=True).stdout


class Server:
    def __init__(
        self, checkout: str, args: list[str], env: dict | None = None, wait: bool = True
    ) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        env = {
            **os.environ,
            "PYTHONPATH": checkout,
            "CADENCE_KV_TRANSFER_SECRET": SECRET,
            **(env or {}),
        }
        cmd = [sys.executable, "-m", "cadence.cli.main", "serve", "--port", str(self.port), *args]
        # (cwd: `python -m` puts the working directory first on sys.path)
        self.proc = subprocess.Popen(
            cmd, env=env, cwd=checkout, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        self.args = args
        if wait:
            self.wait_ready()

    def wait_ready(self, timeout_s: float = 300) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited {self.proc.returncode}: {self.args}")
            try:
                if httpx.get(self.url + "/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(self.args)
            time.sleep(0.3)

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        tree = descendants(self.proc.pid)
        for pid in tree:
            with_signal(pid, signal.SIGCONT)
        self.proc.send_signal(signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(30)
        for pid in [self.proc.pid, *tree]:
            with_signal(pid, signal.SIGKILL)


def with_signal(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, sig)


def descendants(pid: int) -> list[int]:
    kids: dict[int, list[int]] = {}
    for e in os.listdir("/proc"):
        if e.isdigit():
            try:
                with open(f"/proc/{e}/stat") as f:
                    kids.setdefault(int(f.read().rsplit(")", 1)[1].split()[1]), []).append(int(e))
            except OSError:
                pass
    out, todo = [], list(kids.get(pid, []))
    while todo:
        p = todo.pop()
        out.append(p)
        todo += kids.get(p, [])
    return out


def cmdline(pid: int) -> bytes:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read()
    except OSError:
        return b""


def rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        return next(int(x.split()[1]) for x in f if x.startswith("VmRSS")) / 1024


def endpoints(pid: int) -> tuple[list[tuple[str, int]], list[str]]:
    """TCP listeners and unix socket paths of the process tree (from /proc)."""
    inodes = set()
    for p in [pid, *descendants(pid)]:
        try:
            for fd in os.listdir(f"/proc/{p}/fd"):
                t = os.readlink(f"/proc/{p}/fd/{fd}")
                if t.startswith("socket:["):
                    inodes.add(int(t[8:-1]))
        except OSError:
            pass
    tcp = set()
    for name, fam in (("tcp", socket.AF_INET), ("tcp6", socket.AF_INET6)):
        for line in Path(f"/proc/net/{name}").read_text().splitlines()[1:]:
            c = line.split()
            if c[3] == "0A" and int(c[9]) in inodes:
                raw = bytes.fromhex(c[1].split(":")[0])
                raw = (
                    raw[::-1]
                    if fam == socket.AF_INET
                    else b"".join(raw[i : i + 4][::-1] for i in range(0, 16, 4))
                )
                tcp.add((socket.inet_ntop(fam, raw), int(c[1].split(":")[1], 16)))
    lines = Path("/proc/net/unix").read_text().splitlines()[1:]
    unix = {c[7] for c in (x.split() for x in lines) if len(c) >= 8 and int(c[6]) in inodes}
    return sorted(tcp), sorted(unix)


class Bomb:
    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def complete(url: str, prompt, timeout: float = 30, **kw) -> httpx.Response:
    body = {"prompt": prompt, "max_tokens": 8, "temperature": 0, "ignore_eos": True, **kw}
    return httpx.post(
        url + "/v1/completions",
        json=body,
        headers={"Authorization": f"Bearer {KEY}"},
        timeout=timeout,
    )


class FakePeer(threading.Thread):
    """A K/V server of the attacker's. Given the model's shape (`layers`: how many;
    `block`: one block's [2, block_size, kv_heads, head_dim] in float32), it answers a
    fetch as a prefill engine would, with K/V of its own making: what a decode engine
    then caches under the request's prompt."""

    def __init__(self, layers: int = 0, block: list[int] | None = None) -> None:
        super().__init__(daemon=True)
        self.layers, self.block = layers, block
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.ROUTER)
        self.addr = f"tcp://127.0.0.1:{self.sock.bind_to_random_port('tcp://127.0.0.1')}"
        self.fetches = 0
        self.stop = threading.Event()
        self.start()

    def run(self) -> None:
        while not self.stop.is_set():
            if self.sock.poll(100):
                ident, tid, _, count = self.sock.recv_multipart()
                self.fetches += 1
                n = int(count)
                header = {
                    "ok": True,
                    "transfer_id": tid.decode(),
                    "num_tokens": n * self.block[1],
                    "block_size": self.block[1],
                    "layout": [[self.block, "float32"]] * self.layers,
                    "num_blocks": n,
                }
                size = 4 * n * self.block[0] * self.block[1] * self.block[2] * self.block[3]
                junk = [os.urandom(size) for _ in range(self.layers)]
                self.sock.send_multipart([ident, json.dumps(header).encode(), *junk])


def upload_status(port: int, head: str, total: int) -> str:
    reply = bytearray()
    with socket.create_connection(("127.0.0.1", port), timeout=60) as s:

        def read() -> None:
            try:
                while b"\r\n" not in reply and (got := s.recv(4096)):
                    reply.extend(got)
            except OSError:
                pass

        t = threading.Thread(target=read)
        t.start()
        try:
            s.sendall(head.encode())
            chunk, sent = b"x" * (1 << 20), 0
            while sent < total and not reply:
                s.sendall(chunk)
                sent += len(chunk)
        except OSError:
            pass
        t.join(60)
    return bytes(reply).split(b"\r\n")[0].decode(errors="replace")


def make_tiny(out: str) -> None:
    import shutil

    import torch
    import transformers as tf

    from cadence.loader.model_path import resolve_model_path

    src = resolve_model_path(None)
    cfg = tf.LlamaConfig(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=49152,
        max_position_embeddings=512,
        tie_word_embeddings=True,
    )
    torch.manual_seed(0)
    tf.LlamaForCausalLM(cfg).eval().save_pretrained(out)
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        if os.path.exists(f"{src}/{name}"):
            shutil.copy(f"{src}/{name}", f"{out}/{name}")
