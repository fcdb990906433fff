"""Which adapter each of the worker's --max-loras slots holds: the scheduler decides.

A waiting request of an adapter is admitted only if its adapter has a slot this step:
already in one, or put into a slot no running request uses (an empty one first, then the
least recently used). Otherwise it waits, and requests behind it may go first: a slot in
use is never taken from under a running request. Each placement is a LoRALoad the worker
performs before the step's forward pass.
"""

from __future__ import annotations

from collections.abc import Iterable

from cadence.core.request import Request
from cadence.core.scheduler_output import LoRAStats
from cadence.lora_request import LoRALoad, LoRARequest


class LoRASlots:
    def __init__(self, num_slots: int) -> None:
        self.held: list[LoRARequest | None] = [None] * num_slots
        self.last_used = [0] * num_slots  # the step that last admitted a request to it
        self.num_loads = 0  # cumulative: adapters written into a slot
        self._in_use: set[int] = set()

    def forget(self) -> None:
        """After a failed step: a slot may be half-written; every adapter loads again."""
        self.held = [None] * len(self.held)

    def begin_step(self, running: list[Request]) -> None:
        self._in_use = {r.lora.lora_int_id for r in running if r.lora is not None}

    def admit(self, req: Request, step: int, loads: list[LoRALoad]) -> bool:
        """Whether `req` can run this step as far as its adapter goes (a placement it
        needs is appended to `loads`)."""
        lora = req.lora
        if lora is None:
            return True
        ids = [h.lora_int_id if h is not None else None for h in self.held]
        if lora.lora_int_id in ids:
            slot = ids.index(lora.lora_int_id)
        else:
            free = [s for s, i in enumerate(ids) if i is None or i not in self._in_use]
            if not free:
                return False
            slot = min(free, key=lambda s: (ids[s] is not None, self.last_used[s]))
            self.held[slot] = lora
            loads.append(LoRALoad(slot, lora))
            self.num_loads += 1
        self.last_used[slot] = step
        self._in_use.add(lora.lora_int_id)
        return True

    def stats(self, running: Iterable[Request], waiting: Iterable[Request]) -> LoRAStats:
        return LoRAStats(_by_adapter(running), _by_adapter(waiting), self.num_loads)


def _by_adapter(requests: Iterable[Request]) -> dict[str, int]:
    """Adapter name -> how many of `requests` run with it."""
    out: dict[str, int] = {}
    for r in requests:
        if r.lora is not None:
            out[r.lora.lora_name] = out.get(r.lora.lora_name, 0) + 1
    return out
