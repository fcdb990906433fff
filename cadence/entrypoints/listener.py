"""The listening socket of a server, bound before anything slow starts.

    sock = listening_socket(host, port)

A server binds its address first, so a port that is taken fails at once (not after the
model has loaded) and nothing else can take the port while the engine starts: a server
that bound late could lose its port to another process in the meantime, and a client (a
`-dp` router, a test) polling that port would then talk to whoever took it.

A parent that starts servers (`-dp` replicas, tests) binds each one's socket itself and
hands it over: the child inherits the descriptor and finds its number in LISTEN_FD_ENV.
The port is never free between the parent's choice and the child's listen.
"""

from __future__ import annotations

import os
import socket

# The number of an inherited, bound TCP socket to listen on instead of binding host:port.
LISTEN_FD_ENV = "CADENCE_LISTEN_FD"


def bind_listener(host: str, port: int) -> socket.socket:
    """host:port bound (port 0: one the OS picks), inheritable, not yet listening."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    sock.set_inheritable(True)
    return sock


def listening_socket(host: str, port: int) -> socket.socket:
    """The socket LISTEN_FD_ENV names (taken out of the environment, so this process's
    own children do not inherit the claim), else host:port bound here. Raises OSError
    (port taken, not allowed) or ValueError (LISTEN_FD_ENV not a bound TCP socket)."""
    value = os.environ.pop(LISTEN_FD_ENV, None)
    if value is None:
        return bind_listener(host, port)
    try:
        fd = int(value)
        sock = socket.socket(fileno=fd)
    except (ValueError, OSError) as e:
        raise ValueError(f"{LISTEN_FD_ENV}={value!r} is not a socket descriptor: {e}") from None
    tcp = sock.type == socket.SOCK_STREAM and sock.family in (socket.AF_INET, socket.AF_INET6)
    if not tcp or bound_port(sock) == 0:
        sock.detach()  # (not ours to close)
        raise ValueError(f"{LISTEN_FD_ENV}={value!r} is not a bound TCP socket")
    sock.set_inheritable(True)  # (the API processes of a multi-process server listen on it)
    return sock


def bound_port(sock: socket.socket) -> int:
    return sock.getsockname()[1]
