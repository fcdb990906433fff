"""`cadence serve --data-parallel-size N`: N replicas of the server on this machine, behind
one router on the public address.

Each replica is a whole `cadence serve` (API process + engine process) on 127.0.0.1 and a
port this process takes and hands it (entrypoints/listener.py), with the same flags: on GPUs
it sees its own `tensor_parallel_size` of them (CUDA_VISIBLE_DEVICES), on a CPU its own
share of the cores (its engine pins its threads there). The router (cadence/router/) sends
each request to one of them by `--router-policy`. The replicas die with this process;
SIGTERM reaches them (they drain).
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import socket
import subprocess
import sys
import time

import httpx

from cadence.entrypoints.listener import LISTEN_FD_ENV, bind_listener

logger = logging.getLogger("cadence.router")

# Flags of this process that a replica must not get (each takes one value).
_OWN_FLAGS = {
    "--data-parallel-size",
    "-dp",
    "--host",
    "--port",
    "--router-policy",
    "--router-cache-threshold",
    "--router-balance-abs-threshold",
    "--router-balance-rel-threshold",
    "--allowed-hosts",  # the router's door: replicas answer the router on 127.0.0.1
    "--replica-timeout",
}
STARTUP_TIMEOUT_S = 900.0


def replica_argv(argv: list[str]) -> list[str]:
    """`argv` (after `serve`) without this process's own flags."""
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
            continue
        name = a.split("=", 1)[0]
        if name in _OWN_FLAGS:
            skip = "=" not in a
            continue
        out.append(a)
    return out


def placements(n: int, device: str, tp: int) -> list[dict]:
    """Per replica: the environment and CPU cores it gets."""
    import torch

    cuda = device == "cuda" or (device == "auto" and torch.cuda.is_available())
    if cuda:
        have = torch.cuda.device_count()
        if n * tp > have:
            raise ValueError(f"{n} replicas x {tp} GPUs each need {n * tp} GPUs; {have} visible")
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        ids = visible.split(",") if visible else [str(i) for i in range(have)]
        return [
            {"env": {"CUDA_VISIBLE_DEVICES": ",".join(ids[i * tp : (i + 1) * tp])}, "cores": None}
            for i in range(n)
        ]
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < n:  # more replicas than cores: they share them all
        return [{"env": {}, "cores": None} for _ in range(n)]
    share = len(cores) // n
    return [{"env": {}, "cores": cores[i * share : (i + 1) * share]} for i in range(n)]


def start_replicas(argv: list[str], n: int, device: str, tp: int) -> tuple[list, list[str]]:
    """Start the n replica servers (each on a port bound here); if one cannot start, stop
    those already started and raise."""
    from cadence.process import die_with_parent

    parent = os.getpid()
    procs, urls = [], []
    try:
        for i, place in enumerate(placements(n, device, tp)):
            # Bound here and inherited (listener.py): no moment when another process could
            # take the replica's port and answer for it.
            sock = bind_listener("127.0.0.1", 0)
            port = sock.getsockname()[1]
            cores = place["cores"]

            def setup(cores=cores) -> None:  # in the child, before exec
                die_with_parent(parent)
                if cores:
                    os.sched_setaffinity(0, cores)

            cmd = [sys.executable, "-m", "cadence.cli.main", "serve", *argv]
            cmd += ["--host", "127.0.0.1", "--port", str(port)]
            where = place["env"].get("CUDA_VISIBLE_DEVICES") or f"cores {cores or 'all'}"
            logger.info("replica %d on port %d (%s)", i, port, where)
            env = {**os.environ, **place["env"], LISTEN_FD_ENV: str(sock.fileno())}
            with sock:
                procs.append(
                    subprocess.Popen(cmd, env=env, preexec_fn=setup, pass_fds=(sock.fileno(),))
                )
            urls.append(f"http://127.0.0.1:{port}")
    except BaseException:
        stop_replicas(procs, timeout_s=5.0)  # (none left running behind a failed start)
        raise
    return procs, urls


def wait_ready(procs: list, urls: list[str], timeout_s: float = STARTUP_TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout_s
    pending = set(range(len(urls)))
    while pending:
        for i in sorted(pending):
            if procs[i].poll() is not None:
                raise RuntimeError(f"replica {i} exited with code {procs[i].returncode}")
            try:
                if httpx.get(urls[i] + "/health", timeout=1).status_code == 200:
                    pending.discard(i)
            except httpx.HTTPError:
                pass
        if time.monotonic() > deadline:
            raise TimeoutError(f"replicas {sorted(pending)} did not start in {timeout_s:g} s")
        time.sleep(0.3)


def stop_replicas(procs: list, timeout_s: float) -> None:
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + timeout_s + 10
    for p in procs:
        try:
            p.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()


def run_data_parallel(
    args: argparse.Namespace, engine_kwargs: dict, socks: list[socket.socket]
) -> int:
    """`socks`: the router's listening sockets, taken before the replicas start."""
    from cadence.cli.router import load_router_tokenizer, policy_kwargs, router_options
    from cadence.entrypoints.launcher import run_app
    from cadence.router.app import create_router_app

    argv = list(args.argv)
    argv = replica_argv(argv[argv.index("serve") + 1 :] if "serve" in argv else argv)
    tp = engine_kwargs.get("tensor_parallel_size", 1) or 1
    try:
        procs, urls = start_replicas(
            argv, args.data_parallel_size, engine_kwargs.get("device", "auto"), tp
        )
    except (OSError, ValueError) as e:
        logger.error("data parallel start-up failed: %s", e)
        return 1
    try:
        wait_ready(procs, urls)
        tokenizer = load_router_tokenizer(
            engine_kwargs.get("tokenizer") or engine_kwargs.get("model"), urls
        )
        app = create_router_app(
            urls, args.router_policy, tokenizer, options=router_options(args), **policy_kwargs(args)
        )
        logger.info(
            "listening on http://%s:%d (%d replicas, %s)",
            args.host,
            socks[0].getsockname()[1],
            len(urls),
            args.router_policy,
        )
        return run_app(app, socks)
    except (RuntimeError, TimeoutError) as e:
        logger.error("data parallel start-up failed: %s", e)
        return 1
    finally:
        stop_replicas(procs, args.shutdown_timeout)
