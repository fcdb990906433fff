"""The engine's outputs reach the API process that owns each request: one message per
process per step, the stats in every one, and a process that left never stalls the engine."""

from __future__ import annotations

import time

import pytest
import zmq

from cadence.core.scheduler_output import RequestUpdate
from cadence.engine import protocol as P
from cadence.engine.core_proc import make_outbox
from cadence.engine.fanout import OutputFanout


@pytest.fixture
def sockets(tmp_path):
    """(fanout over 3 API processes, their 3 output sockets)."""
    ctx = zmq.Context()
    pulls, pushes = [], []
    for i in range(3):
        addr = f"ipc://{tmp_path}/out{i}"
        pull = ctx.socket(zmq.PULL)
        pull.bind(addr)
        pulls.append(pull)
        pushes.append(make_outbox(ctx, addr, timeout_s=2.0))
    yield OutputFanout(pushes), pulls
    for s in pulls + pushes:
        s.close(linger=0)
    ctx.term()


def received(pull: zmq.Socket) -> P.EngineCoreOutputs:
    assert pull.poll(5000), "a message was expected"
    return P.outputs_decoder.decode(pull.recv())


def test_a_steps_outputs_are_split_by_owner_and_every_process_gets_the_stats(sockets):
    fanout, pulls = sockets
    fanout.own("a", 0)
    fanout.own("b", 2)
    fanout.own("c", 2)
    fanout.own("d", 1)
    stats = P.EngineStats(num_running=3)
    fanout.send(
        P.EngineCoreOutputs(
            updates=[RequestUpdate("a", [1]), RequestUpdate("b", [2]), RequestUpdate("c", [3])],
            errors=[("d", "no grammar")],
            stats=stats,
        )
    )
    got = [received(p) for p in pulls]
    assert [u.request_id for u in got[0].updates] == ["a"]
    assert got[1].updates == [] and got[1].errors == [("d", "no grammar")]
    assert [u.request_id for u in got[2].updates] == ["b", "c"], "one message for both"
    assert all(g.stats.num_running == 3 for g in got)
    assert "d" not in fanout.owner, "an error ends the request"


def test_a_finished_or_aborted_request_is_forgotten(sockets):
    fanout, pulls = sockets
    fanout.own("a", 1)
    fanout.own("b", 1)
    fanout.send(P.EngineCoreOutputs(updates=[RequestUpdate("a", [1], finish_reason="stop")]))
    fanout.forget(["b"])
    assert fanout.owner == {}
    assert [u.request_id for u in received(pulls[1]).updates] == ["a"]


def test_a_call_reply_goes_to_the_process_that_asked(sockets):
    fanout, pulls = sockets
    fanout.reply(P.EngineCallReply(7, {"x": 1}, client_index=2))
    msg = P.outputs_decoder.decode(pulls[2].recv()) if pulls[2].poll(5000) else None
    assert isinstance(msg, P.EngineCallReply) and msg.call_id == 7
    assert not pulls[0].poll(50) and not pulls[1].poll(50)


def test_an_unknown_process_index_is_refused(sockets):
    fanout, _ = sockets
    with pytest.raises(ValueError):
        fanout.own("a", 3)


def test_stats_for_a_process_that_left_never_block_the_engine(tmp_path):
    """A drained API process exits while another still serves: the engine keeps stepping
    (its stats for the gone process are dropped), and the live process gets everything."""
    ctx = zmq.Context()
    live = ctx.socket(zmq.PULL)
    live.bind(f"ipc://{tmp_path}/live")
    outboxes = [
        make_outbox(ctx, f"ipc://{tmp_path}/live", timeout_s=2.0),
        make_outbox(ctx, f"ipc://{tmp_path}/gone", timeout_s=2.0),  # nobody binds it
    ]
    fanout = OutputFanout(outboxes)
    fanout.own("a", 0)
    t0 = time.monotonic()
    try:
        for step in range(3000):  # past the queue's high-water mark towards the gone one
            fanout.send(P.EngineCoreOutputs(updates=[RequestUpdate("a", [step])]))
            while live.poll(0):
                live.recv()
        assert time.monotonic() - t0 < 10, "no send waited for the process that left"
    finally:
        for s in [live, *outboxes]:
            s.close(linger=0)
        ctx.term()


def test_a_process_with_nothing_in_a_step_gets_stats_at_most_every_interval_and_the_last_ones(
    sockets, monkeypatch
):
    """Several steps in a row: the owner gets each; the others get the stats at most every
    STATS_EVERY_S, and flush() (the engine going idle) brings them the latest."""
    monkeypatch.setattr("cadence.engine.fanout.STATS_EVERY_S", 60.0)  # (a slow machine's gaps)
    fanout, pulls = sockets
    fanout.own("a", 0)
    for step in range(5):
        fanout.send(
            P.EngineCoreOutputs(
                updates=[RequestUpdate("a", [step])], stats=P.EngineStats(num_running=step)
            )
        )
    assert [received(pulls[0]).stats.num_running for _ in range(5)] == [0, 1, 2, 3, 4]
    assert received(pulls[1]).stats.num_running == 0
    assert not pulls[1].poll(50), "the steps right after: held back"
    fanout.flush()
    assert received(pulls[1]).stats.num_running == 4, "the latest, once the engine idles"
    assert received(pulls[2]).stats.num_running == 0 and received(pulls[2]).stats.num_running == 4


def test_the_lead_process_gets_the_stats_of_every_step_where_a_request_finished(
    sockets, monkeypatch
):
    """The lead (index 0) records the engine's counters for /metrics: when another process's
    request finishes, the lead gets that step's stats at once, not after the interval, so a
    client holding its answer finds the engine's counters for it there."""
    monkeypatch.setattr("cadence.engine.fanout.STATS_EVERY_S", 60.0)
    fanout, pulls = sockets
    fanout.own("a", 1)
    fanout.own("b", 1)
    fanout.send(P.EngineCoreOutputs(updates=[RequestUpdate("a", [1])], stats=P.EngineStats()))
    assert received(pulls[0]).stats.prefix_queries == 0  # (the first stats: at once)
    assert received(pulls[2]).stats.prefix_queries == 0
    fanout.send(
        P.EngineCoreOutputs(updates=[RequestUpdate("a", [2])], stats=P.EngineStats(num_running=2))
    )
    assert not pulls[0].poll(50), "a step where nothing finished: held back"
    done = P.EngineStats(num_running=1, prefix_queries=6)
    fanout.send(
        P.EngineCoreOutputs(updates=[RequestUpdate("a", [3], finish_reason="stop")], stats=done)
    )
    assert received(pulls[0]).stats.prefix_queries == 6
    assert not pulls[2].poll(50), "other processes keep the interval"
