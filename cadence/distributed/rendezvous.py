"""Where torch.distributed's ranks meet, and which interface its sockets bind.

    file://DIR/rendezvous   ranks of one host (mp executor): a FileStore in the engine's
                            private directory (0700): nothing listens on a port
    tcp://HOST:PORT         ranks on several hosts (Ray): rank 0's TCPStore, listening on
                            HOST only (torch's own TCPStore would listen on every interface)

Then gloo's and NCCL's bootstrap sockets are pinned to the interface that holds the rank's
own address (GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME, unless the user set them): loopback
for one host, the cluster network for Ray, never every interface.
"""

from __future__ import annotations

import datetime
import fcntl
import logging
import os
import socket
import struct
from urllib.parse import urlsplit

logger = logging.getLogger(__name__)

SIOCGIFADDR = 0x8915  # <linux/sockios.h>: an interface's IPv4 address
IFNAME_VARS = ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")
# What the user set before Cadence ran: theirs wins; otherwise each group pins its own.
_USER_IFNAMES = {var: os.environ.get(var) for var in IFNAME_VARS}


def listen_socket(host: str, port: int = 0) -> socket.socket:
    """A TCP socket listening on `host` and `port` (0: a free one), for rank 0's TCPStore:
    bound before any rank starts, so the port is ours (no race with another process)."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(128)
    return sock


def make_store(rank: int, size: int, init_method: str, timeout: datetime.timedelta, listen=None):
    """The rendezvous store of `init_method` (file:// or tcp://, module docstring). Rank 0
    of a tcp:// store serves it on `listen` (a listen_socket(), which the store takes
    over), or binds HOST:PORT itself."""
    import torch.distributed as dist

    url = urlsplit(init_method)
    if url.scheme == "file":
        return dist.FileStore(url.path, size)
    if url.scheme != "tcp" or url.hostname is None or url.port is None:
        raise ValueError(f"init_method must be file://PATH or tcp://HOST:PORT, got {init_method!r}")
    if rank != 0:
        return dist.TCPStore(url.hostname, url.port, size, False, timeout=timeout)
    if listen is None:
        listen = listen_socket(url.hostname, url.port)
    # The store takes the descriptor over: Python must not close it behind its back.
    fd = listen.detach()
    return dist.TCPStore(
        url.hostname,
        url.port,
        size,
        True,
        timeout=timeout,
        wait_for_workers=False,
        master_listen_fd=fd,
    )


def interface_of(address: str) -> str | None:
    """The name of the network interface that holds IPv4 `address` ("lo" for 127.0.0.1),
    or None (not found, not IPv4, not Linux)."""
    try:
        wanted = socket.gethostbyname(address)
        names = [name for _, name in socket.if_nameindex()]
    except OSError:
        return None
    for name in names:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            try:
                packed = fcntl.ioctl(
                    s.fileno(), SIOCGIFADDR, struct.pack("256s", name.encode()[:15])
                )
            except OSError:  # no IPv4 address
                continue
        if socket.inet_ntoa(packed[20:24]) == wanted:
            return name
    return None


def pin_interfaces(address: str) -> None:
    """Bind gloo's and NCCL's sockets to the interface of `address` (this rank's own),
    unless the user chose them (GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME)."""
    if all(_USER_IFNAMES[var] for var in IFNAME_VARS):
        return
    name = interface_of(address)
    if name is None:
        logger.warning(
            "no network interface holds %s: gloo/NCCL choose their own (set GLOO_SOCKET_IFNAME "
            "and NCCL_SOCKET_IFNAME to keep them off public interfaces)",
            address,
        )
        return
    for var in IFNAME_VARS:
        if not _USER_IFNAMES[var]:
            os.environ[var] = name
