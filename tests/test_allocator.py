"""cadence/allocator.py: when the server hands free heap back to the OS, and the arena cap."""

from __future__ import annotations

import ctypes
import os

import pytest

from cadence import allocator
from cadence.allocator import Trimmer

glibc_only = pytest.mark.skipif(
    allocator._glibc() is None, reason="malloc_trim and mallopt are glibc's"
)


class FakeClock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


@pytest.fixture
def calls(monkeypatch) -> list[str]:
    """Record trims instead of making them."""
    made: list[str] = []
    monkeypatch.setattr(allocator, "trim", lambda: made.append("trim") or True)
    return made


def make(clock: FakeClock) -> Trimmer:
    t = Trimmer(idle_after_s=0.5, busy_interval_s=30.0, clock=clock)
    t.enabled = True  # the decisions are the same off glibc; only the call is a no-op
    return t


def test_no_work_no_trim(calls):
    clock = FakeClock()
    t = make(clock)
    for _ in range(10):
        clock.t += 5
        assert not t.tick()
    assert calls == []


def test_trims_once_after_going_idle(calls):
    clock = FakeClock()
    t = make(clock)
    t.worked()
    clock.t += 0.4
    assert not t.tick()  # not idle long enough
    clock.t += 0.2
    assert t.tick() and calls == ["trim"]
    clock.t += 10
    assert not t.tick()  # nothing new to give back
    t.worked()
    clock.t += 0.5
    assert t.tick() and t.trims == 2


def test_under_steady_load_trims_at_the_busy_interval(calls):
    clock = FakeClock()
    t = make(clock)
    trimmed_at = []
    for _ in range(700):  # 70 s of work, a step every 100 ms, never idle
        clock.t += 0.1
        t.worked()
        if t.tick():
            trimmed_at.append(clock.t - 100.0)
    assert len(trimmed_at) == 2
    assert trimmed_at[0] == pytest.approx(30.0, abs=0.11)
    assert trimmed_at[1] - trimmed_at[0] == pytest.approx(30.0, abs=0.11)


def test_disabled_off_glibc(calls):
    clock = FakeClock()
    t = make(clock)
    t.enabled = False
    t.worked()
    clock.t += 5
    assert not t.tick() and calls == []


@glibc_only
def test_trim_and_arena_cap_call_glibc(monkeypatch):
    assert isinstance(allocator.trim(), bool)
    monkeypatch.setenv("MALLOC_ARENA_MAX", "4")
    assert allocator.limit_arenas(2) is False  # the operator's setting wins
    monkeypatch.delenv("MALLOC_ARENA_MAX")
    assert allocator.limit_arenas(8) is True  # 8: glibc's own default on this many cores


@glibc_only
def test_trim_gives_freed_heap_back():
    """Free many small blocks (heap, not mmap): RSS drops only with the trim."""
    libc = ctypes.CDLL(None)
    libc.malloc.restype = ctypes.c_void_p
    libc.malloc.argtypes = [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    libc.memset.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t]

    def rss_mib() -> float:
        with open("/proc/self/status") as f:
            return next(int(x.split()[1]) for x in f if x.startswith("VmRSS:")) / 1024

    size, count = 16 * 1024, 6400  # 100 MiB in blocks below the mmap threshold
    blocks = [libc.malloc(size) for _ in range(count)]
    for b in blocks:
        libc.memset(b, 1, size)
    keep = libc.malloc(64)  # above the freed blocks: the heap's top cannot shrink
    for b in blocks:
        libc.free(b)
    before = rss_mib()
    allocator.trim()
    after = rss_mib()
    libc.free(keep)
    assert before - after > 50, (before, after)


def test_the_onednn_cache_is_bounded_unless_the_user_set_it(monkeypatch):
    monkeypatch.delenv("ONEDNN_PRIMITIVE_CACHE_CAPACITY", raising=False)
    allocator.bound_onednn_cache()
    assert os.environ["ONEDNN_PRIMITIVE_CACHE_CAPACITY"] == str(allocator.ONEDNN_CACHE_CAPACITY)
    monkeypatch.setenv("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "4096")
    allocator.bound_onednn_cache()
    assert os.environ["ONEDNN_PRIMITIVE_CACHE_CAPACITY"] == "4096"


def test_start_up_objects_leave_the_collector_for_good():
    import gc

    from cadence.allocator import freeze_startup_objects

    gc.unfreeze()
    try:
        freeze_startup_objects()
        assert gc.get_freeze_count() > 1000  # pytest's and cadence's imports, at least
        assert gc.get_count()[0] < 10  # the collection ran first: nothing young left behind
    finally:
        gc.unfreeze()
