"""CURVE on Cadence's internal ZMQ channels (cadence/channel_auth.py): a server socket
delivers to, and hears from, only peers holding an allowed key pair; a stranger's
connection is refused and logged; keys derived from one secret agree across processes."""

from __future__ import annotations

import logging

import zmq

from cadence.channel_auth import ChannelGuard, keys_from_secret, make_client, new_keys


def test_keys_from_one_secret_agree_and_differ_by_role():
    a, b = keys_from_secret("s" * 20, "kv-server"), keys_from_secret("s" * 20, "kv-server")
    assert a == b and len(a.public) == 40
    assert keys_from_secret("s" * 20, "kv-client") != a
    assert keys_from_secret("t" * 20, "kv-server") != a


def test_only_the_allowed_key_is_served_and_strangers_are_logged(tmp_path, caplog):
    ctx = zmq.Context()
    server, client = new_keys(), new_keys()
    guard = ChannelGuard(ctx, server, [client.public], "test")
    sockets = []
    try:
        push = ctx.socket(zmq.PUSH)
        push.setsockopt(zmq.IMMEDIATE, 1)  # (a send waits for an admitted peer)
        push.setsockopt(zmq.SNDTIMEO, 10_000)
        guard.serve(push)
        push.bind(f"ipc://{tmp_path}/s")
        peers = {}
        for name, keys, server_public in (
            ("plain", None, None),
            ("wrong key", new_keys(), server.public),
            ("wrong server", client, new_keys().public),
            ("allowed", client, server.public),
        ):
            pull = ctx.socket(zmq.PULL)
            if keys is not None:
                make_client(pull, keys, server_public)
            pull.connect(f"ipc://{tmp_path}/s")
            peers[name] = pull
        sockets = [push, *peers.values()]
        with caplog.at_level(logging.WARNING, logger="cadence.channel_auth"):
            for i in range(20):
                push.send(b"%d" % i)
            got = [peers["allowed"].recv() for _ in range(20)]
            assert got == [b"%d" % i for i in range(20)]
            assert not any(peers[n].poll(200) for n in ("plain", "wrong key", "wrong server"))
        assert guard.refused >= 2
        assert "test channel: refused" in caplog.text
    finally:
        for s in sockets:
            s.close(linger=0)
        guard.close()
        ctx.term()
