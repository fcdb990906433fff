"""The LoRA adapters a server serves, by name: `--lora-modules` at start, and
`POST /v1/load_lora_adapter` / `/v1/unload_lora_adapter` at run time (admin paths: the
admin key when one is set, guards.py).

A request names an adapter in `model`; /v1/models lists each with its parent (the base
model). Every load gets a new adapter id, never reused: the engine keys slots, CPU copies
and prefix-cache namespaces by id, so a name loaded again from another folder can never
read the old one's weights or K/V.

A folder is checked by the engine before the name answers (its config, the safetensors
header, rank and projections against the model): a bad one is a 400 naming why, and
nothing is registered.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import time
from dataclasses import dataclass

from fastapi import FastAPI
from fastapi.responses import PlainTextResponse
from pydantic import BaseModel

from cadence.engine.client import EngineCallError, EngineDeadError
from cadence.entrypoints.errors import APIError
from cadence.lora_request import LoRARequest

# What a client may name an adapter: what a model id looks like (no spaces or controls).
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:/@+-]{0,255}")


@dataclass(frozen=True)
class LoRAModule:
    """One `--lora-modules` entry: name=path, or JSON {"name", "path", "base_model_name"}."""

    name: str
    path: str
    base_model_name: str | None = None

    @classmethod
    def parse(cls, text: str) -> LoRAModule:
        text = text.strip()
        if text.startswith("{"):
            try:
                d = json.loads(text)
                return cls(d["name"], d["path"], d.get("base_model_name"))
            except (ValueError, KeyError, TypeError) as e:
                raise ValueError(
                    f'--lora-modules: {text!r} is not {{"name": ..., "path": ...}} ({e})'
                ) from None
        name, sep, path = text.partition("=")
        if not sep or not name or not path:
            raise ValueError(f"--lora-modules: {text!r} is not NAME=PATH")
        return cls(name, path)


class LoadLoRARequest(BaseModel):
    lora_name: str
    lora_path: str


class UnloadLoRARequest(BaseModel):
    lora_name: str
    lora_int_id: int | None = None


class LoRAAdapters:
    def __init__(self, client, base_name: str) -> None:
        self.client = client  # the engine client: the engine checks each folder
        self.base_name = base_name
        self.by_name: dict[str, tuple[LoRARequest, str, int]] = {}  # -> (req, parent, created)
        self._ids = itertools.count(1)
        self._loading: set[str] = set()  # names whose folder the engine is checking

    def resolve(self, model: str | None) -> LoRARequest | None:
        """The adapter a request's `model` names; None for the base model (or no name)."""
        if model is None or model == self.base_name:
            return None
        entry = self.by_name.get(model)
        if entry is None:
            served = ", ".join(f"`{n}`" for n in [self.base_name, *self.by_name])
            raise APIError(
                f"The model `{model}` does not exist. Serving: {served}.",
                404,
                "NotFoundError",
                "model",
                "model_not_found",
            )
        return entry[0]

    async def load(self, name: str, path: str, parent: str | None = None) -> LoRARequest:
        """Check a folder in the engine and serve it as `name`; `parent`: what /v1/models
        names its base model (--lora-modules' base_model_name; default the served name)."""
        if not _NAME.fullmatch(name):
            raise APIError(
                f"{name!r} is not a usable adapter name (letters, digits and ._:/@+-, up to "
                "256 characters)",
                param="lora_name",
            )
        if name == self.base_name or name in self.by_name or name in self._loading:
            raise APIError(f"The lora adapter '{name}' has already been loaded.", param="lora_name")
        if not isinstance(path, str) or not path or "\x00" in path:
            raise APIError("lora_path must name a folder", param="lora_path")
        lora = LoRARequest(name, next(self._ids), os.path.realpath(path))
        self._loading.add(name)  # (a second load of the name while this one waits: a 400)
        try:
            await self.client.call(
                "check_lora", name=lora.lora_name, id=lora.lora_int_id, path=lora.lora_path
            )
        except EngineCallError as e:
            raise APIError(str(e), param="lora_path", code="invalid_lora_adapter") from None
        except (EngineDeadError, TimeoutError) as e:
            raise APIError(
                f"the engine could not check the adapter ({e or 'no answer'})",
                503,
                "service_unavailable",
            ) from None
        finally:
            self._loading.discard(name)
        self.by_name[name] = (lora, parent or self.base_name, int(time.time()))
        return lora

    def unload(self, name: str) -> None:
        if self.by_name.pop(name, None) is None:
            raise APIError(
                f"The lora adapter '{name}' cannot be found.",
                404,
                "NotFoundError",
                "lora_name",
                "lora_not_found",
            )

    def cards(self, max_model_len: int) -> list[dict]:
        """/v1/models entries of the adapters."""
        return [
            {
                "id": name,
                "object": "model",
                "created": created,
                "owned_by": "cadence",
                "root": lora.lora_path,
                "parent": parent,
                "max_model_len": max_model_len,
            }
            for name, (lora, parent, created) in self.by_name.items()
        ]


def install_lora_routes(app: FastAPI, state: dict) -> None:
    """The run-time load and unload endpoints (admin paths: guards.ADMIN_PATHS)."""

    def one_process() -> None:
        # (each API process keeps its own table of names: a load through one would not be
        # seen by the others)
        if state.get("api_server_count", 1) > 1:
            raise APIError(
                "adapters cannot be loaded or unloaded at run time with several API processes "
                "(--api-server-count): name them with --lora-modules",
                param="lora_name",
            )

    @app.post("/v1/load_lora_adapter")
    async def load_lora_adapter(req: LoadLoRARequest):
        one_process()
        adapters: LoRAAdapters = state["adapters"]
        await adapters.load(req.lora_name, req.lora_path)
        return PlainTextResponse(f"Success: LoRA adapter '{req.lora_name}' added successfully.")

    @app.post("/v1/unload_lora_adapter")
    async def unload_lora_adapter(req: UnloadLoRARequest):
        one_process()
        adapters: LoRAAdapters = state["adapters"]
        adapters.unload(req.lora_name)
        return PlainTextResponse(f"Success: LoRA adapter '{req.lora_name}' removed successfully.")
