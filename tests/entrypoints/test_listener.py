"""A server's listening socket: bound before anything slow, or inherited from the parent
that bound it (LISTEN_FD_ENV), so the port is never free while the server starts."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile

import pytest

from cadence.entrypoints.listener import LISTEN_FD_ENV, bind_listener, listening_socket


def test_without_a_handover_the_address_is_bound_here(monkeypatch):
    monkeypatch.delenv(LISTEN_FD_ENV, raising=False)
    with listening_socket("127.0.0.1", 0) as sock:
        port = sock.getsockname()[1]
        assert port != 0
        with socket.socket() as other, pytest.raises(OSError):
            other.bind(("127.0.0.1", port))  # (held, though nobody listens yet)


def test_a_taken_port_raises_at_once():
    with bind_listener("127.0.0.1", 0) as taken:
        taken.listen()
        with pytest.raises(OSError):
            bind_listener("127.0.0.1", taken.getsockname()[1])


def test_a_child_listens_on_the_socket_its_parent_bound():
    """The parent binds, the child inherits the descriptor and accepts on that very port;
    the variable is gone from the child's environment once taken (its own children do not
    inherit the claim)."""
    child = (
        "import os, socket\n"
        "from cadence.entrypoints.listener import LISTEN_FD_ENV, listening_socket\n"
        "sock = listening_socket('127.0.0.1', 1)\n"  # (the port argument is not used)
        "sock.listen()\n"
        "print(sock.getsockname()[1], LISTEN_FD_ENV in os.environ, flush=True)\n"
        "conn, _ = sock.accept()\n"
        "conn.sendall(b'mine')\n"
    )
    with bind_listener("127.0.0.1", 0) as sock:
        port = sock.getsockname()[1]
        env = {**os.environ, LISTEN_FD_ENV: str(sock.fileno())}
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


@pytest.mark.parametrize("kind", ["not-a-number", "a-file", "unbound-socket", "udp-socket"])
def test_a_handover_that_is_no_bound_tcp_socket_is_refused(kind, monkeypatch):
    keep = []
    if kind == "not-a-number":
        value = "3; rm -rf /"
    elif kind == "a-file":
        f = tempfile.TemporaryFile()  # noqa: SIM115 (closed in the finally below)
        keep.append(f)
        value = str(f.fileno())
    else:
        s = socket.socket(type=socket.SOCK_DGRAM if kind == "udp-socket" else socket.SOCK_STREAM)
        if kind == "udp-socket":
            s.bind(("127.0.0.1", 0))
        keep.append(s)
        value = str(s.fileno())
    monkeypatch.setenv(LISTEN_FD_ENV, value)
    try:
        with pytest.raises(ValueError, match=LISTEN_FD_ENV):
            listening_socket("127.0.0.1", 0)
        for obj in keep:  # (refused, not closed: the descriptor is still the caller's)
            os.fstat(obj.fileno())
    finally:
        for obj in keep:
            obj.close()
