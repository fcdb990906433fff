"""A server's listening sockets: taken before anything slow, or inherited from the parent
that took them (LISTEN_FD_ENV), so the port is never free, nor shareable, while the server
starts."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile

import pytest

from cadence.entrypoints.listener import LISTEN_FD_ENV, bind_listener, listening_sockets


def _thief(port: int, host: str = "127.0.0.1") -> socket.socket:
    """Another process's try at the port, with every option that lets a bind share it."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    return sock


@pytest.mark.parametrize("thief_host", ["127.0.0.1", "0.0.0.0"])
def test_nobody_else_binds_the_port_while_the_engine_loads(thief_host, monkeypatch):
    """The attacker binds with SO_REUSEADDR, which on Linux shares a port that is bound but
    not listening yet: the sockets listen from the start, so the bind fails."""
    monkeypatch.delenv(LISTEN_FD_ENV, raising=False)
    socks = listening_sockets("127.0.0.1", 0)
    try:
        assert len(socks) == 1
        port = socks[0].getsockname()[1]
        assert port != 0
        with pytest.raises(OSError):
            _thief(port, thief_host).close()
    finally:
        for sock in socks:
            sock.close()


def test_every_address_of_the_host_listens_on_one_port(monkeypatch):
    monkeypatch.delenv(LISTEN_FD_ENV, raising=False)
    try:
        want = {i[4][0] for i in socket.getaddrinfo("localhost", 0, type=socket.SOCK_STREAM)}
        socks = listening_sockets("localhost", 0)
    except OSError as e:  # (a machine whose localhost has an address it cannot bind)
        pytest.skip(f"localhost's addresses cannot be bound here: {e}")
    try:
        assert {s.getsockname()[0] for s in socks} == want
        assert len({s.getsockname()[1] for s in socks}) == 1
        for sock in socks:
            if sock.family == socket.AF_INET6:  # (IPv6 only, as asyncio's servers)
                assert sock.getsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY) == 1
    finally:
        for sock in socks:
            sock.close()


def test_a_taken_port_raises_at_once(monkeypatch):
    monkeypatch.delenv(LISTEN_FD_ENV, raising=False)
    with bind_listener("127.0.0.1", 0) as taken, pytest.raises(OSError):
        listening_sockets("127.0.0.1", taken.getsockname()[1])


def test_a_child_serves_on_the_socket_its_parent_took():
    """The parent takes the port, the child inherits the descriptor and accepts on that very
    port; the variable is gone from the child's environment once taken (its own children do
    not inherit the claim)."""
    child = (
        "import os\n"
        "from cadence.entrypoints.listener import LISTEN_FD_ENV, listening_sockets\n"
        "[sock] = listening_sockets('127.0.0.1', int(os.environ['PORT']))\n"
        "print(sock.getsockname()[1], LISTEN_FD_ENV in os.environ, flush=True)\n"
        "conn, _ = sock.accept()\n"
        "conn.sendall(b'mine')\n"
    )
    with bind_listener("127.0.0.1", 0) as sock:
        port = sock.getsockname()[1]
        env = {**os.environ, LISTEN_FD_ENV: str(sock.fileno()), "PORT": str(port)}
        proc = subprocess.Popen(
            [sys.executable, "-c", child],
            env=env,
            pass_fds=(sock.fileno(),),
            stdout=subprocess.PIPE,
            text=True,
        )
    try:
        said_port, still_set = proc.stdout.readline().split()
        assert int(said_port) == port and still_set == "False"
        with socket.create_connection(("127.0.0.1", port), timeout=30) as conn:
            assert conn.recv(4) == b"mine"
    finally:
        proc.kill()
        proc.wait(10)
        proc.stdout.close()


@pytest.mark.parametrize(
    "kind", ["not-a-number", "a-file", "unbound-socket", "bound-not-listening", "udp", "other-port"]
)
def test_a_handover_that_is_no_listening_tcp_socket_is_refused(kind, monkeypatch):
    keep = []
    if kind == "not-a-number":
        value = "3; rm -rf /"
    elif kind == "a-file":
        f = tempfile.TemporaryFile()  # noqa: SIM115 (closed in the finally below)
        keep.append(f)
        value = str(f.fileno())
    else:
        if kind == "other-port":
            s = bind_listener("127.0.0.1", 0)
        else:
            s = socket.socket(type=socket.SOCK_DGRAM if kind == "udp" else socket.SOCK_STREAM)
            if kind in ("udp", "bound-not-listening"):
                s.bind(("127.0.0.1", 0))
        keep.append(s)
        value = str(s.fileno())
    monkeypatch.setenv(LISTEN_FD_ENV, value)
    port = 1 if kind == "other-port" else 0  # (a --port the socket is not on)
    try:
        with pytest.raises(ValueError, match=LISTEN_FD_ENV):
            listening_sockets("127.0.0.1", port)
        for obj in keep:  # (refused, not closed: the descriptor is still the caller's)
            os.fstat(obj.fileno())
    finally:
        for obj in keep:
            obj.close()


def test_port_zero_on_several_addresses_tries_another_port(monkeypatch):
    """The port the first address got was taken on the second: a new pick, not a failure."""
    import errno

    from cadence.entrypoints import listener

    monkeypatch.delenv(LISTEN_FD_ENV, raising=False)
    real, calls = listener._listen, []

    def second_taken_once(sock, address):
        calls.append(address)
        if len(calls) == 2:
            sock.close()
            raise OSError(errno.EADDRINUSE, "Address already in use")
        return real(sock, address)

    monkeypatch.setattr(listener, "_listen", second_taken_once)
    two = [(socket.AF_INET, ("127.0.0.1", 0)), (socket.AF_INET, ("127.0.0.2", 0))]
    monkeypatch.setattr(
        socket, "getaddrinfo", lambda *a, **k: [(f, socket.SOCK_STREAM, 6, "", ad) for f, ad in two]
    )
    socks = listening_sockets("twohomed", 0)
    try:
        assert len(calls) == 4 and len(socks) == 2  # (first try: 2 calls; second: 2)
        assert len({s.getsockname()[1] for s in socks}) == 1
    finally:
        for sock in socks:
            sock.close()
