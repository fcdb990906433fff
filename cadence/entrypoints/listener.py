"""The listening sockets of a server, bound and listening before anything slow starts.

    socks = listening_sockets(host, port)        # one per address of `host`

A server takes its address first, so a port that is taken fails at once (not after the
model has loaded), and nothing else can take the port while the engine starts: a server
that bound late could lose its port to another process in the meantime, and a client (a
`-dp` router, a test) polling that port would talk to whoever took it. The sockets listen
at once, because on Linux a bound socket that does not listen yet can be bound again by any
process (any user) that sets SO_REUSEADDR; a listening one cannot. (Clients that connect
while the engine loads wait in the backlog until the server accepts.)

A parent that starts servers (`-dp` replicas, tests) takes each one's socket itself and
hands it over: the child inherits the descriptor (Popen's `pass_fds`) and finds its number
in LISTEN_FD_ENV. The port is never free between the parent's choice and the child's
accept.

Addresses follow asyncio's `create_server`: every address `host` resolves to (both of
localhost's, say) whose family this machine has, IPv6 sockets IPv6 only, SO_REUSEADDR (a
restart need not wait out TIME_WAIT).
"""

from __future__ import annotations

import errno
import os
import socket

# The number of an inherited, listening TCP socket to serve on instead of binding host:port.
LISTEN_FD_ENV = "CADENCE_LISTEN_FD"
BACKLOG = 2048  # (uvicorn's default)
PORT_ZERO_TRIES = 5  # ports tried for `--port 0` on a host of several addresses


def bind_listener(host: str, port: int) -> socket.socket:
    """One socket on host:port (a numeric address; port 0: one the OS picks), listening."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    return _listen(socket.socket(family, socket.SOCK_STREAM), (host, port))


def listening_sockets(host: str, port: int) -> list[socket.socket]:
    """The socket LISTEN_FD_ENV names (taken out of the environment, so this process's own
    children do not inherit the claim), else one listening socket per address of host:port.
    Raises OSError (port taken, host unknown, not allowed), OverflowError (no such port) or
    ValueError (LISTEN_FD_ENV not a listening TCP socket, or on another port than `port`)."""
    value = os.environ.pop(LISTEN_FD_ENV, None)
    if value is not None:
        return [_inherited(value, port)]
    infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    addresses = list(dict.fromkeys((family, address) for family, *_, address in infos))
    tries = PORT_ZERO_TRIES if port == 0 and len(addresses) > 1 else 1
    for attempt in range(tries):
        try:
            return _listen_all(host, port, addresses)
        except OSError as e:
            # (port 0 on several addresses: the port the first one got may be taken on
            # another of them, and another port will do)
            if e.errno != errno.EADDRINUSE or attempt == tries - 1:
                raise
    raise AssertionError("unreachable")


def _listen_all(host: str, port: int, addresses: list[tuple]) -> list[socket.socket]:
    socks: list[socket.socket] = []
    try:
        for family, address in addresses:
            try:
                sock = socket.socket(family, socket.SOCK_STREAM)
            except OSError:  # (a family this machine lacks, IPv6 off at boot: as asyncio)
                continue
            # (port 0 with several addresses: the rest take the port the first one got)
            chosen = socks[0].getsockname()[1] if socks else port
            socks.append(_listen(sock, (address[0], chosen, *address[2:])))
    except BaseException:
        for sock in socks:
            sock.close()
        raise
    if not socks:
        raise OSError(f"no address of {host!r} has a family this machine can listen on")
    return socks


def _listen(sock: socket.socket, address: tuple) -> socket.socket:
    """`sock` bound to `address` and listening; closed if either fails."""
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if sock.family == socket.AF_INET6:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        sock.bind(address)
        sock.listen(BACKLOG)
    except BaseException:
        sock.close()
        raise
    return sock


def _inherited(value: str, port: int) -> socket.socket:
    try:
        sock = socket.socket(fileno=int(value))
    except (ValueError, OSError) as e:
        raise ValueError(f"{LISTEN_FD_ENV}={value!r} is not a socket descriptor: {e}") from None
    try:
        tcp = sock.type == socket.SOCK_STREAM and sock.family in (socket.AF_INET, socket.AF_INET6)
        listening = tcp and sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN)
        bound = sock.getsockname()[1] if tcp else 0
    except OSError:
        listening = bound = 0
    if not listening or (port and bound != port):
        sock.detach()  # (refused, not closed: the descriptor stays its owner's)
        where = f" on port {port}" if port else ""
        raise ValueError(f"{LISTEN_FD_ENV}={value!r} is not a listening TCP socket{where}")
    sock.set_inheritable(False)  # (this process's children get it only when handed it)
    return sock
