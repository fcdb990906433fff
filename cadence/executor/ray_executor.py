"""Ranks 1..N-1 as Ray actors, for tensor parallelism over several hosts.

Ray is the cluster layer: it starts the actors, places them (a placement group of one
bundle per rank: a GPU each, or a CPU each on a CPU cluster), and tells us when one dies.
Everything per step goes over the same ZMQ channel as the mp executor (step_channel.py),
not through Ray's task calls: over TCP on this node's address, CURVE-authenticated with
keys made for this launch and handed to the actors through Ray. The collectives go over
torch.distributed, its rendezvous on that address only (distributed/rendezvous.py). Ray
itself runs whatever its cluster is told to: keep its ports (GCS, dashboard, workers) on
a private network (docs/security.md).

Rank 0 is this process. Its bundle is held by a placeholder actor, so Ray hands that GPU
to no rank; rank 0 uses the GPU Ray gave the placeholder, which must be on this host.

Connect to a running cluster with RAY_ADDRESS (or `ray.init(...)` before building the
engine); otherwise a local Ray instance is started and stopped with the engine.
"""

from __future__ import annotations

import logging
import os

import torch

from cadence.executor.distributed import DistributedExecutor
from cadence.executor.worker import WorkerSpec, run_worker

logger = logging.getLogger(__name__)

PLACEMENT_TIMEOUT_S = 120.0
STOP_TIMEOUT_S = 10.0


class RayWorker:
    """The actor: one rank (see worker.py)."""

    def node_and_gpus(self) -> tuple[str, list[int]]:
        import ray

        return ray.util.get_node_ip_address(), [int(g) for g in ray.get_gpu_ids()]

    def run(self, spec: WorkerSpec) -> int:
        import dataclasses

        import ray

        logging.basicConfig(
            level=spec.log_level,
            format=f"%(asctime)s %(levelname)s [rank {spec.rank}] %(name)s: %(message)s",
        )
        # gloo / NCCL bind this node's own address (rank 0's is the engine's node's).
        here = ray.util.get_node_ip_address()
        return run_worker(dataclasses.replace(spec, bind_address=here))


class RayExecutor(DistributedExecutor):
    same_host = False  # step channel over TCP (CURVE), rendezvous on rank 0's address

    def _prepare(self) -> str:
        import ray

        self._started_ray = False
        if not ray.is_initialized():
            ray.init(address=os.environ.get("RAY_ADDRESS"), log_to_driver=True)
            self._started_ray = True
        from ray.util.placement_group import placement_group

        resource = "GPU" if self.device_type == "cuda" else "CPU"
        self.pg = placement_group([{resource: 1}] * self.size, strategy="PACK")
        ready, _ = ray.wait([self.pg.ready()], timeout=PLACEMENT_TIMEOUT_S)
        if not ready:
            raise RuntimeError(
                f"Ray could not place {self.size} ranks ({resource}: 1 each) within "
                f"{PLACEMENT_TIMEOUT_S:.0f} s; cluster resources: {ray.cluster_resources()}"
            )
        self.actor_class = ray.remote(RayWorker)
        # The placeholder holds rank 0's bundle; it must be on this host.
        self.placeholder = self._actor(0)
        node, gpus = ray.get(self.placeholder.node_and_gpus.remote())
        here = ray.util.get_node_ip_address()
        if node != here:
            raise RuntimeError(
                f"rank 0 runs in the engine's process on {here}, but Ray placed its bundle "
                f"on {node}: give this host a free {resource}"
            )
        self._driver_gpu = gpus[0] if gpus else 0
        return here

    def _actor(self, bundle: int):
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        resources = {"num_gpus": 1} if self.device_type == "cuda" else {"num_cpus": 1}
        return self.actor_class.options(
            **resources,
            scheduling_strategy=PlacementGroupSchedulingStrategy(
                placement_group=self.pg, placement_group_bundle_index=bundle
            ),
        ).remote()

    def _driver_device(self) -> torch.device:
        if self.device_type != "cuda":
            return torch.device("cpu")
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        index = self._driver_gpu
        if visible:  # Ray's ids are physical; this process may see a subset
            index = [int(v) for v in visible.split(",")].index(index)
        return torch.device("cuda", index)

    def _worker_device(self, rank: int) -> str:
        return "cuda:0" if self.device_type == "cuda" else "cpu"  # Ray sets the GPU

    def _launch(self, specs: list[WorkerSpec]) -> None:
        self.actors = [self._actor(spec.rank) for spec in specs]
        self.runs = [actor.run.remote(spec) for actor, spec in zip(self.actors, specs)]

    def _wait_for_death(self) -> str | None:
        import ray

        done, _ = ray.wait(self.runs, num_returns=1, timeout=None)
        if self._closed:
            return None
        rank = self.runs.index(done[0]) + 1
        try:
            code = ray.get(done[0])
            return f"rank {rank} (Ray actor) ended with code {code}"
        except Exception as e:  # the actor died: Ray says how
            return f"rank {rank} (Ray actor) died: {type(e).__name__}: {e}"

    def _stop_ranks(self) -> None:
        import ray

        if not ray.is_initialized():
            return
        runs = getattr(self, "runs", [])
        if runs and not (self._broken or self._dead):
            ray.wait(runs, num_returns=len(runs), timeout=STOP_TIMEOUT_S)
        for actor in [*getattr(self, "actors", []), getattr(self, "placeholder", None)]:
            if actor is not None:
                ray.kill(actor)
        if getattr(self, "pg", None) is not None:
            from ray.util.placement_group import remove_placement_group

            remove_placement_group(self.pg)
        if getattr(self, "_started_ray", False):
            ray.shutdown()
