"""The intake gate: a few POST requests between arrival and the engine at once; a request
leaves it when its prompt is sent, when it is answered, or when it has held its place too
long; other requests never wait on it. And the engine client says when a prompt is sent."""

from __future__ import annotations

import asyncio

import pytest

from cadence.config import EngineConfig
from cadence.engine.client import AsyncEngineClient, request_submitted
from cadence.entrypoints.intake import IntakeGate
from cadence.sampling_params import SamplingParams


class FakeApp:
    """An ASGI app whose requests do `intake_s` of intake, then (if `submits`) say their
    prompt was sent, then stream until `stream_done` is set."""

    def __init__(self, intake_s: float = 0.01, submits: bool = True) -> None:
        self.intake_s = intake_s
        self.submits = submits
        self.in_intake = 0
        self.most_in_intake = 0
        self.entered: list[str] = []
        self.stream_done = asyncio.Event()

    async def __call__(self, scope, receive, send) -> None:
        self.entered.append(scope["path"])
        self.in_intake += 1
        self.most_in_intake = max(self.most_in_intake, self.in_intake)
        await asyncio.sleep(self.intake_s)
        self.in_intake -= 1
        if self.submits and (submitted := request_submitted.get()) is not None:
            submitted()
        if scope["path"] == "/stream":
            await self.stream_done.wait()


def http(path: str, method: str = "POST") -> dict:
    return {"type": "http", "method": method, "path": path}


async def call(gate: IntakeGate, scope: dict) -> None:
    await gate(scope, None, None)


def test_at_most_the_limit_are_in_intake_and_streams_hold_no_place():
    async def main():
        app = FakeApp()
        gate = IntakeGate(app, limit=2)
        streams = [asyncio.create_task(call(gate, http("/stream"))) for _ in range(6)]
        await asyncio.sleep(0.2)  # 3 rounds of 2 intakes: every stream past the gate
        assert len(app.entered) == 6 and app.in_intake == 0
        assert app.most_in_intake == 2
        app.stream_done.set()
        await asyncio.gather(*streams)

    asyncio.run(main())


async def first_then_second(gate: IntakeGate, app: FakeApp) -> list[asyncio.Task]:
    """Two requests at once; returns once the first is in intake and the second waits."""
    tasks = [asyncio.create_task(call(gate, http(p))) for p in ("/first", "/second")]
    await asyncio.sleep(0.02)
    assert app.entered == ["/first"]
    return tasks


def test_a_request_answered_without_the_engine_leaves_when_answered():
    async def main():
        app = FakeApp(intake_s=0.05, submits=False)
        gate = IntakeGate(app, limit=1, hold_max_s=10.0)
        await asyncio.gather(*await first_then_second(gate, app))
        assert app.entered == ["/first", "/second"]

    asyncio.run(main())


def test_a_slow_intake_gives_its_place_up_after_the_hold_limit():
    async def main():
        app = FakeApp(intake_s=5.0, submits=False)
        gate = IntakeGate(app, limit=1, hold_max_s=0.05)
        tasks = await first_then_second(gate, app)
        await asyncio.sleep(0.1)
        assert app.entered == ["/first", "/second"]  # the slow one kept its place 0.05 s
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        assert gate.places._value == 1  # every place given back exactly once

    asyncio.run(main())


@pytest.mark.parametrize("scope", [http("/v1/models", "GET"), {"type": "websocket", "path": "/"}])
def test_other_requests_never_wait_on_the_gate(scope):
    async def main():
        app = FakeApp(intake_s=0.0)
        gate = IntakeGate(app, limit=1, hold_max_s=10.0)
        busy = asyncio.create_task(call(gate, http("/stream")))  # its place: taken
        await asyncio.sleep(0)
        app.submits = False
        await asyncio.wait_for(call(gate, scope), 1.0)
        assert app.entered[-1] == scope["path"]
        app.stream_done.set()
        await busy

    asyncio.run(main())


def test_zero_turns_the_gate_off(monkeypatch):
    monkeypatch.setenv("CADENCE_INTAKE_LIMIT", "0")
    assert IntakeGate(FakeApp()).places is None
    monkeypatch.setenv("CADENCE_INTAKE_LIMIT", "3")
    assert IntakeGate(FakeApp()).places._value == 3


class UnstartedClient(AsyncEngineClient):
    """The engine client with its core replaced by a list of what was sent to it."""

    healthy = True

    def __init__(self) -> None:
        super().__init__(EngineConfig(), None)
        self.sent: list[str] = []

    async def _send_to_core(self, frames) -> None:
        self.sent.append("add")

    async def _abort_in_core(self, sample_ids) -> None:
        self.sent.append("abort")


def test_the_engine_client_says_when_every_sample_was_sent():
    async def main():
        client = UnstartedClient()
        seen = []
        request_submitted.set(lambda: seen.append(list(client.sent)))
        gen = client.generate("r", None, [1, 2, 3], SamplingParams(max_tokens=4, n=3))
        with pytest.raises(TimeoutError):  # sent; now waiting for the engine's tokens
            await asyncio.wait_for(anext(gen), 0.05)
        assert seen == [["add", "add", "add"]]  # once, after the last sample went

    asyncio.run(main())
