"""What an attacker on the same host sees and tries: the sockets a server's processes listen
on (from /proc, which any user can read), payloads that run code if unpickled, and a
process of another user (when the tests run as root)."""

from __future__ import annotations

import contextlib
import json
import os
import pickle
import socket
from pathlib import Path

NOBODY = 65534


def process_tree(pid: int) -> list[int]:
    """`pid` and all its descendants."""
    kids: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except OSError:
            continue
        kids.setdefault(ppid, []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(kids.get(p, []))
    return out


def _socket_inodes(pid: int) -> set[int]:
    inodes = set()
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if target.startswith("socket:["):
                inodes.add(int(target[8:-1]))
    except OSError:
        pass
    return inodes


def _tcp_listeners() -> dict[int, tuple[str, int]]:
    """inode -> (address, port) of every listening TCP socket on the host."""
    out = {}
    for name, family in (("tcp", socket.AF_INET), ("tcp6", socket.AF_INET6)):
        try:
            lines = Path(f"/proc/net/{name}").read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            cols = line.split()
            if cols[3] != "0A":  # LISTEN
                continue
            addr_hex, port_hex = cols[1].split(":")
            raw = bytes.fromhex(addr_hex)
            if family == socket.AF_INET:
                addr = socket.inet_ntop(family, raw[::-1])
            else:
                addr = socket.inet_ntop(
                    family, b"".join(raw[i : i + 4][::-1] for i in range(0, 16, 4))
                )
            out[int(cols[9])] = (addr, int(port_hex, 16))
    return out


def _unix_paths() -> dict[int, str]:
    """inode -> path of every named unix socket on the host."""
    out = {}
    for line in Path("/proc/net/unix").read_text().splitlines()[1:]:
        cols = line.split()
        if len(cols) >= 8 and cols[7].startswith("/"):
            out[int(cols[6])] = cols[7]
    return out


def listening_endpoints(pid: int) -> tuple[list[tuple[str, int]], list[str]]:
    """(TCP (address, port) pairs, unix socket paths) the process tree of `pid` listens on
    (what `ss -lp` would show an administrator; an attacker scans /proc/net the same way)."""
    inodes: set[int] = set()
    for p in process_tree(pid):
        inodes |= _socket_inodes(p)
    tcp = _tcp_listeners()
    unix = _unix_paths()
    return sorted({tcp[i] for i in inodes if i in tcp}), sorted(
        {unix[i] for i in inodes if i in unix}
    )


class RunsCode:
    """Unpickling this runs `touch MARKER`."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def pickle_payloads(marker: str) -> list[bytes]:
    """Frames that run code in whoever unpickles them, in the shapes the old step channel
    took (a list of ops) and bare."""
    bomb = RunsCode(marker)
    return [
        pickle.dumps([("exec", bomb)], protocol=pickle.HIGHEST_PROTOCOL),
        pickle.dumps(bomb),
        pickle.dumps(("ready", bomb)),
    ]


def zmtp_greeting() -> bytes:
    """The first bytes of a ZMTP 3.0 NULL-mechanism handshake (a plain ZMQ peer)."""
    return b"\xff" + b"\x00" * 8 + b"\x7f" + b"\x03\x00" + b"NULL".ljust(20, b"\x00") + b"\x00" * 32


def raw_poke(addr: tuple[str, int], payload: bytes) -> None:
    """Connect, send `payload`, close: what a port scanner or a fuzzer does."""
    with contextlib.suppress(OSError), socket.create_connection(addr, timeout=2) as s:
        s.sendall(payload)
        s.settimeout(0.5)
        s.recv(256)


def as_other_user(fn, *args):
    """`fn(*args)` in a child process running as nobody (needs root): its JSON-able result,
    or {"error": "ExceptionName: ..."}."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: drop to nobody, run, report
        os.close(r)
        try:
            os.setgroups([])
            os.setgid(NOBODY)
            os.setuid(NOBODY)
            result = fn(*args)
        except BaseException as e:  # noqa: BLE001 (reported to the parent)
            result = {"error": f"{type(e).__name__}: {e}"}
        os.write(w, json.dumps(result).encode())
        os._exit(0)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        data = f.read()
    os.waitpid(pid, 0)
    return json.loads(data)
