"""Several API processes in front of one engine core: `cadence serve --api-server-count N`.

    code = run_api_servers(config, options, socks, host, shutdown_timeout)

One Python process tokenizing, detokenizing and writing every SSE event caps an engine that
makes tens of thousands of tokens a second. Here this process, the supervisor
(`cadence::serve`), splits that work over N API processes (`cadence::api0`, ...):

  - it resolves the model (a GGUF is converted once) and makes a private directory (0700)
    for the ipc sockets and the metrics files (the listening sockets are taken already:
    listener.py);
  - it starts the engine core, which reads requests from every API process (and a control
    socket of the supervisor's) and sends each process the outputs of its own requests
    (engine/fanout.py), then the N API processes. Each gets the listening sockets (the kernel
    hands a new connection to whichever process accepts first, so a less busy one takes
    more), its attachment to the engine, and the admission counts in shared memory: the
    server's limits and /metrics (prometheus_client's multiprocess files) stay whole;
  - then it waits. SIGTERM (or SIGINT) is passed to every API process, which drains its own
    requests as a single server does (SIGINT: without grace); when all have left, the engine
    is told to stop. An API process that exits on its own (killed, crashed, or after the
    engine died, which every API process sees) ends the server: the others stop at once and
    the exit code is 1, for the supervisor above (systemd, Kubernetes) to start a fresh one.

The API processes run in their own process group, so a Ctrl-C at the terminal reaches them
once, through here.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import multiprocessing as mp
import multiprocessing.connection
import os
import shutil
import signal
import socket
import sys
import time

import zmq

from cadence.config import EngineConfig
from cadence.engine import protocol as P
from cadence.engine.client import EngineAttachment
from cadence.engine.core_proc import run_engine_core
from cadence.entrypoints.admission import SharedCounts
from cadence.entrypoints.api_server import ServerOptions
from cadence.metrics import MULTIPROC_DIR_ENV
from cadence.private_dirs import make_private_dir

logger = logging.getLogger("cadence.api")

ENGINE_STOP_TIMEOUT_S = 15.0  # after SHUTDOWN, before the engine is terminated
STOP_GRACE_S = 30.0  # beyond --shutdown-timeout, before an API process that stays is killed


def default_api_server_count(device: str) -> int:
    """One API process per 8 cores beside a GPU engine, at most 4; one on a CPU engine,
    whose threads want every core. (Asked without torch: the API side never imports it.)"""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    gpu_here = os.path.exists("/dev/nvidiactl") and visible not in ("", "-1")
    if not (device == "cuda" or (device == "auto" and gpu_here)):
        return 1
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return max(1, min(4, (cores or 1) // 8))


def run_api_servers(
    config: EngineConfig,
    options: ServerOptions,
    socks: list[socket.socket],
    host: str,
    shutdown_timeout: float,
) -> int:
    """`socks`: the server's listening sockets (listener.listening_sockets); closed here
    once the API processes hold them."""
    from cadence.loader.model_path import resolve_model_path

    count = options.api_server_count
    port = socks[0].getsockname()[1]
    config.model.model = resolve_model_path(config.model.model)  # once, before N processes
    workdir = make_private_dir("cadence-")
    metrics_dir = os.path.join(workdir, "metrics")
    os.mkdir(metrics_dir)
    os.environ[MULTIPROC_DIR_ENV] = metrics_dir  # (read by prometheus_client at its import)
    spawn = mp.get_context("spawn")
    level = logging.getLogger().getEffectiveLevel()
    attachments = [
        EngineAttachment(i, f"ipc://{workdir}/in{i}", f"ipc://{workdir}/out{i}", 0)
        for i in range(count)
    ]
    ctx = zmq.Context()
    control = ctx.socket(zmq.PUSH)
    control.bind(f"ipc://{workdir}/control")
    engine = spawn.Process(
        target=run_engine_core,
        args=(
            config,
            [f"ipc://{workdir}/control", *(a.in_addr for a in attachments)],
            [a.out_addr for a in attachments],
            level,
            os.getpid(),
            True,
        ),
        name="cadence::engine",
        daemon=True,
    )
    engine.start()
    counts = SharedCounts(spawn)
    apis = []
    for a in attachments:
        a = dataclasses.replace(a, engine_pid=engine.pid)
        p = spawn.Process(
            target=run_api_process,
            args=(
                config,
                options,
                a,
                counts,
                socks,
                host,
                port,
                shutdown_timeout,
                level,
                os.getpid(),
            ),
            name=f"cadence::api{a.client_index}",
        )
        p.start()
        apis.append(p)
    for sock in socks:
        sock.close()  # (the API processes hold them)
    logger.info("%d API processes, engine pid %d", count, engine.pid)
    try:
        code = _supervise(apis, shutdown_timeout)
    finally:
        _stop_engine(engine, control)
        control.close(linger=0)
        ctx.term()
        shutil.rmtree(workdir, ignore_errors=True)
    return code


def _supervise(apis: list, shutdown_timeout: float) -> int:
    """Wait for every API process; pass signals on; one leaving on its own ends them all.
    Those still there `shutdown_timeout` + STOP_GRACE_S after the stop began are killed."""
    stopping = {"signal": None, "since": None}

    def on_signal(sig: int, frame) -> None:
        first = stopping["signal"] is None
        stopping["signal"] = sig
        stopping["since"] = stopping["since"] or time.monotonic()
        logger.info("signal %d: stopping %d API processes", sig, len(apis))
        for p in apis:
            if p.is_alive():
                os.kill(p.pid, sig if first else signal.SIGINT)

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
    code = 0
    try:
        running = {p.sentinel: p for p in apis}
        while running:
            since = stopping["since"]
            if since is not None and time.monotonic() - since > shutdown_timeout + STOP_GRACE_S:
                for p in running.values():
                    logger.error("%s did not stop: killed", p.name)
                    p.kill()
                code = 1
                stopping["since"] = time.monotonic()  # (the kills land within the next wait)
            for sentinel in mp.connection.wait(list(running), timeout=1.0):
                p = running.pop(sentinel)
                p.join()
                if stopping["signal"] is None or p.exitcode != 0:
                    code = 1
                if stopping["signal"] is None:
                    logger.error("%s exited (code %s): the server stops", p.name, p.exitcode)
                    stopping["signal"] = signal.SIGINT
                    stopping["since"] = time.monotonic()
                    for other in running.values():
                        if other.is_alive():
                            os.kill(other.pid, signal.SIGINT)
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    return code


def _stop_engine(engine: mp.process.BaseProcess, control: zmq.Socket) -> None:
    if engine.is_alive():
        with contextlib.suppress(zmq.ZMQError):
            control.send_multipart([P.SHUTDOWN, b""], zmq.NOBLOCK)
        engine.join(ENGINE_STOP_TIMEOUT_S)
    if engine.is_alive():
        engine.terminate()
        engine.join(5)
    if engine.is_alive():
        engine.kill()
        engine.join(5)


def run_api_process(
    config: EngineConfig,
    options: ServerOptions,
    attach: EngineAttachment,
    counts: SharedCounts,
    socks: list[socket.socket],
    host: str,
    port: int,
    shutdown_timeout: float,
    log_level: int,
    parent_pid: int,
) -> None:
    """An API process's entry point (spawned by run_api_servers)."""
    from cadence.allocator import limit_arenas
    from cadence.entrypoints.api_server import create_app
    from cadence.entrypoints.launcher import serve
    from cadence.process import die_with_parent

    if not die_with_parent(parent_pid):
        return  # the supervisor died while this process started
    os.setpgid(0, 0)  # Ctrl-C reaches the supervisor, which passes it on once
    name = f"cadence::api{attach.client_index}"
    try:
        from setproctitle import setproctitle

        setproctitle(name)
    except ImportError:
        pass
    logging.basicConfig(
        level=log_level,
        format=f"%(asctime)s %(levelname)s [api{attach.client_index}] %(name)s: %(message)s",
    )
    limit_arenas()
    app = create_app(config, options, attach, counts)
    sys.exit(serve(app, host, port, shutdown_timeout, socks))
