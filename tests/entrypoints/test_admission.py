"""Admission counts sequences and prompt tokens; a request too large ever is a 400, one that
does not fit now is a 429; everything it held is released when it ends."""

from __future__ import annotations

import pytest

from cadence.entrypoints.admission import Admission
from cadence.entrypoints.errors import APIError, QueueFull


def make(seqs=4, waiting=4, tokens=1000) -> Admission:
    return Admission(seqs, waiting, tokens)


def test_sequences_count_not_requests():
    adm = make()
    with adm.admit(6, [10]), adm.admit(2, [10]):
        assert adm.seqs_in_flight == 8
        with pytest.raises(QueueFull), adm.admit(1, [1]):
            pass
    assert adm.seqs_in_flight == 0 and adm.queued_prompt_tokens == 0


def test_a_request_too_large_alone_is_a_400_not_a_429():
    adm = make()
    with pytest.raises(APIError) as e, adm.admit(9, [1]):
        pass
    assert e.value.status == 400 and "9 sequences" in e.value.message
    with pytest.raises(APIError) as e, adm.admit(2, [600, 600]):
        pass
    assert e.value.status == 400 and "1200 tokens" in e.value.message


def test_queued_prompt_tokens_leave_the_queue_as_each_prompt_starts():
    adm = make(tokens=1000)
    with adm.admit(2, [400, 500]) as ticket:
        assert adm.queued_prompt_tokens == 900
        with pytest.raises(QueueFull), adm.admit(1, [200]):
            pass
        ticket.started(0)
        ticket.started(0)  # idempotent
        assert adm.queued_prompt_tokens == 500
        with adm.admit(1, [200]):
            assert adm.queued_prompt_tokens == 700
    assert adm.queued_prompt_tokens == 0 and adm.idle


def test_rejections_are_counted():
    rejected = []
    adm = Admission(1, 0, 100, on_reject=lambda: rejected.append(1))
    with adm.admit(1, [1]), pytest.raises(QueueFull), adm.admit(1, [1]):
        pass
    assert rejected == [1]


def _hold_in_other_process(counts, admitted, release) -> None:
    adm = Admission(4, 0, 1000, counts=counts)
    with adm.admit(3, [500]):
        admitted.set()
        release.wait(30)


def test_the_bounds_hold_across_api_processes():
    """Several API processes (--api-server-count) share the counts: what one holds, the
    others cannot take; each drains only its own."""
    import multiprocessing as mp

    from cadence.entrypoints.admission import SharedCounts

    spawn = mp.get_context("spawn")
    counts = SharedCounts(spawn)
    admitted, release = spawn.Event(), spawn.Event()
    other = spawn.Process(target=_hold_in_other_process, args=(counts, admitted, release))
    other.start()
    try:
        assert admitted.wait(60)
        here = Admission(4, 0, 1000, counts=counts)
        assert here.seqs_in_flight == 3 and here.queued_prompt_tokens == 500
        assert here.idle, "this process holds nothing: its drain does not wait for the other"
        with pytest.raises(QueueFull), here.admit(2, [1]):
            pass
        with here.admit(1, [1]):
            assert here.seqs_in_flight == 4 and not here.idle
    finally:
        release.set()
        other.join(30)
    assert other.exitcode == 0
    assert here.seqs_in_flight == 0 and here.queued_prompt_tokens == 0
