"""An adapter as a request names it. Also the wire format (msgspec) to the engine."""

from __future__ import annotations

import msgspec


class LoRARequest(msgspec.Struct, frozen=True, array_like=True):
    """`lora_int_id` (>= 1) is the adapter's identity in the engine: its slot, its CPU
    copy and its prefix-cache namespace are keyed by it, so one id must always mean one
    folder (the server hands out a new id for every load)."""

    lora_name: str
    lora_int_id: int
    lora_path: str

    @property
    def cache_namespace(self) -> bytes:
        """What its prompt's block hashes start from: adapters never share K/V."""
        return f"lora:{self.lora_int_id}:{self.lora_name}:{self.lora_path}".encode()


class LoRALoad(msgspec.Struct, array_like=True):
    """The scheduler -> the worker: put this adapter into this slot before the step."""

    slot: int
    lora: LoRARequest
