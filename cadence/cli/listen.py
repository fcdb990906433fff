"""A server command's listening sockets, or one line saying why not."""

from __future__ import annotations

import argparse
import logging
import socket


def listen(args: argparse.Namespace) -> list[socket.socket] | None:
    """`args.host`:`args.port` listening (cadence/entrypoints/listener.py), or None once a
    taken port or a bad address is logged in one line (no traceback)."""
    from cadence.entrypoints.listener import listening_sockets

    try:
        return listening_sockets(args.host, args.port)
    except (OSError, OverflowError, ValueError) as e:
        reason = getattr(e, "strerror", None) or e
        logging.getLogger("cadence").error(
            "cannot listen on %s:%d: %s", args.host, args.port, reason
        )
        return None
