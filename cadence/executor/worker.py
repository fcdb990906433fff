"""A tensor-parallel rank other than 0: its own process, one device, the same ModelRunner.

    join the process group; build the runner (loads this rank's shard)    -> Ready
    loop: receive the step's ops from rank 0, in order (step_messages.py)
        Exec      runner.execute_model(step); if it samples, receive rank 0's ids
        Resolve   runner.resolve(oldest pending): append those ids to its token lists
        Shutdown  leave

Rank 0 and this rank make the same calls in the same order, so their collectives pair up
and their request state stays identical. Any exception ends the process with code 1 (after
telling rank 0 why): a rank cannot skip a step, so the engine cannot go on without it.

Started by the mp executor as `python -m cadence.executor.worker` (its spec as JSON on
stdin: the channel's keys never appear on a command line), or inside a Ray actor
(`RayWorker.run`). It connects to rank 0 with the launch's CURVE keys and checks rank 0's
(channel_auth.py).
"""

from __future__ import annotations

import logging
import os
import signal
import sys
from collections import deque
from dataclasses import dataclass

import msgspec
import zmq

from cadence.allocator import freeze_startup_objects
from cadence.channel_auth import CurveKeys, make_client
from cadence.config import EngineConfig
from cadence.executor import step_messages as M
from cadence.executor.base import drafter_factory

logger = logging.getLogger("cadence.worker")

POLL_MS = 1000  # while waiting for a step: check on the parent this often


@dataclass
class WorkerSpec:
    config: EngineConfig
    rank: int
    size: int
    device: str  # "cuda:1", or "cuda:0" in a Ray actor (Ray picks its GPU), or "cpu"
    init_method: str  # torch.distributed's rendezvous: file://PATH or tcp://host:port
    step_addr: str  # where rank 0 pushes this rank's step messages
    control_addr: str  # where this rank reports ready / error
    model_path: str  # the checkpoint folder (rank 0 converted a GGUF file already)
    channel_keys: CurveKeys  # this launch's rank key pair (channel_auth.py)
    server_public: str  # rank 0's public key: only rank 0 can answer
    bind_address: str = "127.0.0.1"  # this rank's own address: gloo / NCCL bind it
    parent_pid: int | None = None  # exit when this process is gone (mp)
    log_level: int = logging.INFO


def run_worker(spec: WorkerSpec) -> int:
    """The rank's whole life; returns its exit code."""
    import torch

    from cadence.distributed.parallel_state import destroy_tensor_parallel, init_tensor_parallel
    from cadence.worker.model_runner import ModelRunner

    ctx = zmq.Context()
    steps = ctx.socket(zmq.PULL)
    make_client(steps, spec.channel_keys, spec.server_public)
    steps.connect(spec.step_addr)
    control = ctx.socket(zmq.PUSH)
    control.setsockopt(zmq.LINGER, 2000)
    make_client(control, spec.channel_keys, spec.server_public)
    control.connect(spec.control_addr)
    try:
        device = torch.device(spec.device)
        if device.type == "cuda":
            torch.cuda.set_device(device)
        else:  # the host's cores, shared between the ranks
            torch.set_num_threads(max(1, (os.cpu_count() or 1) // spec.size))
        init_tensor_parallel(spec.rank, spec.size, device, spec.init_method, spec.bind_address)
        runner = ModelRunner(spec.config, spec.model_path, drafter_factory(spec.config))
        freeze_startup_objects()  # (every rank's pause would stall the step)
        control.send(M.encode(M.Ready(spec.rank)))
        pending = deque()
        while True:
            if not steps.poll(POLL_MS):
                if spec.parent_pid is not None and os.getppid() != spec.parent_pid:
                    logger.warning("rank %d: the engine process is gone; exiting", spec.rank)
                    return 0
                continue
            for op in M.decode_ops(steps.recv()):
                if isinstance(op, M.Exec):
                    out = runner.execute_model(M.to_scheduler_output(op.step))
                    if out.sample_ids:
                        pending.append(runner.sample_async(out))
                elif isinstance(op, M.Resolve):
                    runner.resolve(pending.popleft())
                elif isinstance(op, M.Shutdown):
                    # Every rank leaves the group at once: NCCL's teardown waits on its peers.
                    destroy_tensor_parallel()
                    return 0
    except BaseException as e:
        logger.exception("tensor-parallel rank %d failed", spec.rank)
        control.send(M.encode(M.Failed(spec.rank, f"{type(e).__name__}: {e}")))
        return 1
    finally:
        steps.close(linger=0)
        control.close()
        ctx.term()


def encode_spec(spec: WorkerSpec) -> bytes:
    return msgspec.json.encode(spec)


def main() -> None:
    spec = msgspec.json.decode(sys.stdin.buffer.read(), type=WorkerSpec)
    logging.basicConfig(
        level=spec.log_level,
        format=f"%(asctime)s %(levelname)s [rank {spec.rank}] %(name)s: %(message)s",
    )
    from cadence.process import die_with_parent

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is rank 0's to handle; it stops us
    if spec.parent_pid is not None and not die_with_parent(spec.parent_pid):
        sys.exit(0)
    try:
        from setproctitle import setproctitle

        setproctitle(f"cadence::tp{spec.rank}")
    except ImportError:
        pass
    code = run_worker(spec)
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # skip interpreter teardown: NCCL / Ray destructors may block on peers


if __name__ == "__main__":
    main()
