"""Prompt K/V moved between engines: disaggregated prefill and decode (connector.py)."""

from __future__ import annotations


class NoConnector:
    """An engine without --kv-role: moves nothing (a null object, so the engine never asks
    whether it has a connector)."""

    role = None
    addr = ""  # where a decode engine would fetch from: nowhere
    num_staged = 0

    def close(self) -> None:
        return None


def make_connector(config, kv_caches: list):
    """The connector of an engine started with --kv-role: `--kv-connector tcp` (bytes over
    ZMQ, between hosts too), `shm` (same host: shared memory files, names over ZMQ) or
    `cuda_ipc` (same host, GPU to GPU: CUDA IPC handles over ZMQ). Without a role,
    `NoConnector`."""
    if config.kv_role is None:
        return NoConnector()
    from cadence.kv_transfer.connector import KVLayers
    from cadence.kv_transfer.cuda_ipc import CudaIpcKVConnector
    from cadence.kv_transfer.shm import ShmKVConnector
    from cadence.kv_transfer.tcp import TcpKVConnector

    cls = {"tcp": TcpKVConnector, "shm": ShmKVConnector, "cuda_ipc": CudaIpcKVConnector}[
        config.kv_connector
    ]
    layers = KVLayers(kv_caches, config.cache.block_size)
    return cls(
        layers,
        config.kv_role,
        config.kv_transfer_secret,
        config.kv_transfer_host,
        config.kv_transfer_port,
    )
