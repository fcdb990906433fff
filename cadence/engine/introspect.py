"""The engine core's answers to the API server's questions (EngineCall -> EngineCallReply):

    steps          the step timeline: phase times and batch composition of recent steps
    requests       the requests the core holds: state, tokens, cache hits, age
    start_profile  start torch.profiler in this process
    check_lora     whether this engine can run an adapter folder (a ValueError naming why
                   not: the API server's 400)
    stop_profile   stop it; answered once the trace is written (a writer thread writes
                   it while the engine keeps stepping: `finished_replies()` hands the
                   loop answers that came later)

Answered between steps, in the core's own process: what they read is consistent.
"""

from __future__ import annotations

import queue
import time
from concurrent.futures import Future
from typing import TYPE_CHECKING

from cadence.core.request import RequestStatus
from cadence.engine import protocol as P
from cadence.engine.profiler import EngineProfiler, ProfilerError
from cadence.lora_request import LoRARequest

if TYPE_CHECKING:
    from cadence.core.request import Request
    from cadence.engine.core import EngineCore

MAX_REQUEST_ROWS = 1000

_STATES = {
    RequestStatus.WAITING: "waiting",
    RequestStatus.RUNNING: "running",
    RequestStatus.PREEMPTED: "preempted",
}


class Introspection:
    def __init__(self, core: EngineCore) -> None:
        self.core = core
        c = core.config
        self.profiler = EngineProfiler(c.profile_dir, c.profile_max_seconds, c.profile_max_traces)
        self._methods = {
            "steps": self.steps,
            "requests": self.requests,
            "start_profile": self.profiler.start,
            "stop_profile": self.profiler.stop,
            "check_lora": self.check_lora,
        }
        self._later: queue.SimpleQueue[P.EngineCallReply] = queue.SimpleQueue()

    def answer(self, call: P.EngineCall) -> P.EngineCallReply | None:
        """The reply now, or None: it comes from finished_replies() when ready."""
        method = self._methods.get(call.method)
        if method is None:
            return P.EngineCallReply(
                call.call_id, error=f"unknown call {call.method!r}", client_index=call.client_index
            )
        try:
            result = method(**call.args)
        except (ProfilerError, TypeError, ValueError) as e:
            return P.EngineCallReply(call.call_id, error=str(e), client_index=call.client_index)
        if not isinstance(result, Future):
            return P.EngineCallReply(call.call_id, result, client_index=call.client_index)
        result.add_done_callback(lambda f, c=call: self._later.put(_reply_of(c, f)))
        return None

    def finished_replies(self) -> list[P.EngineCallReply]:
        out = []
        while not self._later.empty():
            out.append(self._later.get_nowait())
        return out

    def check_lora(self, name: str, id: int, path: str) -> dict:
        self.core.runner.check_lora(LoRARequest(str(name), int(id), str(path)))
        return {"ok": True}

    def steps(self, since: int = 0, limit: int | None = None) -> dict:
        timeline = self.core.timeline
        return {
            "capacity": timeline.size,
            "num_steps": timeline.num_steps,
            "steps": timeline.snapshot(int(since), None if limit is None else int(limit)),
        }

    def requests(self, limit: int = MAX_REQUEST_ROWS) -> dict:
        """The requests the core holds, oldest first (at most `limit` of them)."""
        core = self.core
        now = time.time()
        rows = [_row(r, "grammar", now) for r in core.gate.awaiting.values()]
        rows += [_row(r, _STATES.get(r.status, r.status.name.lower()), now) for r in _held(core)]
        rows.sort(key=lambda row: row["arrival_time"])
        return {"total": len(rows), "requests": rows[: max(0, int(limit))]}


def _reply_of(call: P.EngineCall, done: Future) -> P.EngineCallReply:
    try:
        return P.EngineCallReply(call.call_id, done.result(), client_index=call.client_index)
    except Exception as e:
        why = f"{type(e).__name__}: {e}"
        return P.EngineCallReply(call.call_id, error=why, client_index=call.client_index)


def _held(core: EngineCore) -> list[Request]:
    return [r for r in core.scheduler.requests.values() if not r.is_finished]


def _row(req: Request, state: str, now: float) -> dict:
    """One request's line in the table (tokens, not blocks)."""
    return {
        "id": req.request_id,
        "state": state,
        "prompt_tokens": req.num_prompt_tokens,
        "output_tokens": req.num_output_tokens,
        "computed_tokens": req.num_computed_tokens,
        "cached_tokens": req.num_cached_prompt_tokens,
        "preemptions": req.num_preemptions,
        "priority": req.priority,
        "arrival_time": req.arrival_time,
        "age_s": round(now - req.arrival_time, 3),
    }
