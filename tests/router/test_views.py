"""The router's summed engine view (cadence/router/views.py summed_stats): counters add up
across replicas, fractions are recomputed from the sums, and what each replica decides for
itself (its step pacing) is shown as the largest, not a sum."""

from __future__ import annotations

from cadence.router.views import summed_stats


def reading(finished: int, used: int, blocks: int, cap: int, step_ms: float) -> dict:
    return {
        "time": 10.0 + finished,
        "uptime_s": 5.0,
        "draining": False,
        "model": "m",
        "requests": {"finished": finished},
        "kv_cache": {"used_blocks": used, "num_blocks": blocks, "usage": used / blocks},
        "prefix_cache": {"hit_tokens": 1, "queried_tokens": 4, "hit_rate": 0.25},
        "scheduler": {"prefill_cap": cap, "decode_step_ms": step_ms},
    }


def test_counters_add_up_and_each_replicas_pacing_is_not_summed():
    out = summed_stats([reading(3, 10, 100, 800, 11.5), reading(4, 30, 100, 600, 12.5)])
    assert out["requests"]["finished"] == 7 and out["model"] == "m"
    assert out["kv_cache"]["usage"] == 40 / 200
    assert out["prefix_cache"]["hit_rate"] == 2 / 8
    assert out["scheduler"] == {"prefill_cap": 800, "decode_step_ms": 12.5}
    assert out["time"] == 14.0
    # a replica with no bound (0) makes the whole unbounded; one that says nothing is skipped
    silent = reading(1, 0, 100, 0, 0.0) | {"scheduler": None}
    out = summed_stats([silent, reading(3, 10, 100, 800, 11.5), reading(4, 30, 100, 0, 0.0)])
    assert out["scheduler"] == {"prefill_cap": 0, "decode_step_ms": 11.5}
