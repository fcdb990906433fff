"""The worker's adapters: which slot holds which, copies in CPU memory, the step's plan.

The scheduler decides slots (slots.py); the worker follows: before a step it writes the
adapters the schedule names into their slots (`load`), from its CPU copies, an LRU of
--max-cpu-loras adapters read from their folders on first use; then it plans which tokens
read which slot (`plan`). A slot is never rewritten while a request in the batch uses it
(the scheduler sees to that).
"""

from __future__ import annotations

import logging
from collections import OrderedDict

import numpy as np
import torch
from torch import nn

from cadence.config import EngineConfig, LoRAConfig
from cadence.lora.adapter import (
    Adapter,
    AdapterError,
    AdapterSpec,
    inspect_adapter,
    load_adapter,
)
from cadence.lora.batch import LoRABatch
from cadence.lora.weights import peft_targets, wrap_model
from cadence.lora_request import LoRALoad, LoRARequest

logger = logging.getLogger(__name__)


class LoRAManager:
    def __init__(
        self,
        model: nn.Module,
        config: LoRAConfig,
        max_tokens: int,
        dtype: torch.dtype,
        device: torch.device,
    ) -> None:
        self.config = config
        self.batch = LoRABatch(config.max_loras, max_tokens, device)
        self.targets = peft_targets(model)
        self.layers = wrap_model(
            model, config.max_loras, config.max_lora_rank, self.batch, dtype, device
        )
        self.slot_of: dict[int, int] = {}  # adapter id -> its slot
        # adapter id -> every projection's slot image (LoRAWeights.image), LRU
        self.cpu: OrderedDict[int, dict[tuple[int, str], tuple]] = OrderedDict()
        self.adapter_of: dict[str, int] = {}  # request id -> adapter id
        self.slot_loads = 0
        self._checked: dict[int, str] = {}  # adapter id -> the folder it was checked as
        per_slot = sum(w.a[0].nbytes + w.b[0].nbytes for w in self.layers.values())
        logger.info(
            "LoRA: %d slots of rank <= %d over %d projections, %.1f MiB a slot",
            config.max_loras,
            config.max_lora_rank,
            len(self.layers),
            per_slot / 2**20,
        )

    @classmethod
    def for_runner(
        cls, model: nn.Module, config: EngineConfig, dtype: torch.dtype, device: torch.device
    ) -> LoRAManager | None:
        """The runner's manager (None without --enable-lora). Built after the weights are
        in and before any CUDA graph is captured (the graphs hold its products)."""
        if not config.lora.enable_lora:
            return None
        return cls(model, config.lora, config.scheduler.max_num_batched_tokens, dtype, device)

    # ---- between steps ----------------------------------------------------------------

    def follow(
        self,
        new: list[tuple[str, LoRARequest | None]],
        finished: list[str],
        loads: list[LoRALoad],
    ) -> None:
        """A schedule's deltas: its new requests (id, adapter), finished ids, slot loads."""
        for rid in finished:
            self.adapter_of.pop(rid, None)
        for rid, lora in new:
            if lora is not None:
                self.adapter_of[rid] = lora.lora_int_id
        self.load(loads)

    def load(self, loads: list[LoRALoad]) -> None:
        for load in loads:
            images = self._cpu_copy(load.lora)
            for aid, slot in list(self.slot_of.items()):
                if slot == load.slot:
                    del self.slot_of[aid]
            for where, weights in self.layers.items():
                weights.write(load.slot, images[where])
            self.slot_of[load.lora.lora_int_id] = load.slot
            self.slot_loads += 1

    def plan(self, request_ids: list[str], query_lens: list[int]) -> None:
        """The step's requests in batch order and their token counts."""
        slots = []
        for rid in request_ids:
            aid = self.adapter_of.get(rid)
            if aid is not None and aid not in self.slot_of:
                raise RuntimeError(f"request {rid}: its adapter {aid} is in no slot")
            slots.append(-1 if aid is None else self.slot_of[aid])
        self.batch.plan(np.repeat(np.asarray(slots, dtype=np.int64), query_lens))

    # ---- adapters ---------------------------------------------------------------------

    def _cpu_copy(self, lora: LoRARequest) -> dict[tuple[int, str], tuple]:
        """The adapter's slot images, read from its folder on first use."""
        images = self.cpu.get(lora.lora_int_id)
        if images is None:
            adapter = load_adapter(lora.lora_path, self.config.max_lora_rank)
            self.check(adapter.spec)
            images = {
                (layer, path): weights.image(self._parts(adapter, layer, path))
                for (layer, path), weights in self.layers.items()
            }
            self.cpu[lora.lora_int_id] = images
            while len(self.cpu) > self.config.max_cpu_loras:
                self.cpu.popitem(last=False)
        self.cpu.move_to_end(lora.lora_int_id)
        return images

    def check_request(self, lora: LoRARequest) -> None:
        """Refuse, before it queues, a request whose adapter this model cannot run
        (AdapterError, naming why); its folder's header is read once per adapter id."""
        if lora.lora_int_id < 1:
            raise ValueError(f"lora_int_id must be >= 1, got {lora.lora_int_id}")
        known = self._checked.get(lora.lora_int_id)
        if known == lora.lora_path:
            return
        if known is not None:
            raise ValueError(
                f"adapter id {lora.lora_int_id} already names {known!r}; give "
                f"{lora.lora_path!r} an id of its own"
            )
        self.check(inspect_adapter(lora.lora_path, self.config.max_lora_rank))
        self._checked[lora.lora_int_id] = lora.lora_path

    def check(self, spec: AdapterSpec) -> None:
        """Refuse an adapter for modules this model does not have."""
        for layer, module in spec.modules:
            where = self.targets.get(module)
            if where is None or (layer, where[0]) not in self.layers:
                raise AdapterError(
                    f"{spec.path}: layer {layer} {module} is not a projection this model "
                    f"adapts (it adapts {', '.join(sorted(self.targets))})"
                )

    def _parts(self, adapter: Adapter, layer: int, path: str) -> dict:
        parts = {}
        for module, (ours, part) in self.targets.items():
            if ours == path and (layer, module) in adapter.modules:
                parts[part] = adapter.modules[(layer, module)]
        return parts
