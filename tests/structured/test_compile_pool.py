"""The compile pool's time bound, with jobs the test holds (an Event) in place of C++ compiles
that cannot be interrupted: an expired job's thread is abandoned and replaced, the number of
abandoned threads is bounded, and capacity comes back when an abandoned job returns."""

from __future__ import annotations

import threading
import time

import pytest

from cadence.structured.compile_pool import CompilePool, CompilerBusy


def held(release: threading.Event, started: threading.Event | None = None):
    def job():
        if started is not None:
            started.set()
        release.wait(30)
        return "late"

    return job


def wait_until(cond, seconds: float = 10.0) -> None:
    deadline = time.monotonic() + seconds
    while not cond():
        assert time.monotonic() < deadline, "condition never held"
        time.sleep(0.005)


def expire(pool: CompilePool, seconds: float = 10.0) -> list:
    deadline = time.monotonic() + seconds
    while not (late := pool.expired()):
        assert time.monotonic() < deadline, "no job expired"
        time.sleep(0.005)
    return late


def test_an_expired_job_is_reported_once_and_its_thread_replaced():
    release, started = threading.Event(), threading.Event()
    pool = CompilePool(threads=1, timeout=0.05, max_abandoned=2)
    slow = pool.submit("slow", held(release, started))
    assert started.wait(5)
    assert pool.next_deadline() is not None
    assert [j.key for j in expire(pool)] == ["slow"]
    assert pool.expired() == []  # reported once
    assert (pool.num_active, pool.num_abandoned) == (1, 1)
    # The only original thread is stuck, yet the next job runs on its replacement.
    assert pool.submit("next", lambda: 42).future.result(5) == 42
    release.set()
    wait_until(lambda: pool.num_abandoned == 0)
    assert not slow.future.done()  # the late result is dropped, never delivered
    pool.shutdown()


def test_time_in_the_queue_and_in_setup_does_not_count():
    release = threading.Event()
    setups = []
    pool = CompilePool(threads=1, timeout=0.2, max_abandoned=1, setup=lambda: setups.append(1))
    first = pool.submit("first", held(release))
    queued = pool.submit("queued", lambda: "ok")
    # `queued` waits behind `first` until that expires: longer than the timeout.
    assert [j.key for j in expire(pool)] == ["first"]
    assert queued.future.result(5) == "ok"  # started on the replacement thread, in time
    assert setups  # setup ran before each job
    release.set()
    assert not first.future.done()
    pool.shutdown()


def test_abandoned_threads_are_bounded_and_a_pool_without_threads_refuses_at_once():
    release = threading.Event()
    pool = CompilePool(threads=1, timeout=0.05, max_abandoned=1)
    for i in range(2):  # each expiry abandons the thread that runs it
        started = threading.Event()
        pool.submit(f"slow{i}", held(release, started))
        assert started.wait(5)
        expire(pool)
    assert (pool.num_active, pool.num_abandoned) == (0, 2)
    refused = pool.submit("new", lambda: 1)
    with pytest.raises(CompilerBusy, match="2 earlier compiles ran past --grammar-compile-timeout"):
        refused.future.result(0)
    release.set()  # the stuck compiles return: their threads leave and capacity comes back
    wait_until(lambda: pool.num_active == 1 and pool.num_abandoned == 0)
    assert pool.submit("after", lambda: 7).future.result(5) == 7
    pool.shutdown()


def test_jobs_queued_when_the_last_thread_is_abandoned_fail_instead_of_waiting_forever():
    release, started = threading.Event(), threading.Event()
    pool = CompilePool(threads=1, timeout=0.05, max_abandoned=0)
    pool.submit("slow", held(release, started))
    assert started.wait(5)
    queued = pool.submit("queued", lambda: 1)
    expire(pool)
    with pytest.raises(CompilerBusy):
        queued.future.result(1)
    release.set()
    pool.shutdown()


def test_errors_reach_the_future():
    pool = CompilePool(threads=1, timeout=5, max_abandoned=1)

    def bad():
        raise ValueError("bad grammar")

    with pytest.raises(ValueError, match="bad grammar"):
        pool.submit("bad", bad).future.result(5)
    pool.shutdown()
    with pytest.raises(CompilerBusy):
        pool.submit("after-shutdown", lambda: 1).future.result(0)
