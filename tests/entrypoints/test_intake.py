"""The intake gate: a few requests to the generating endpoints between arrival and the
engine at once; a request leaves it when its prompt is sent, when it is answered, or when it
has held its place too long; other requests never wait on it; a drain answers those still
waiting. The engine client says when a prompt is sent, and that reaches the gate through
FastAPI's streamed and non-streamed routes."""

from __future__ import annotations

import asyncio

import httpx
import pytest
from fastapi import FastAPI, Request

from cadence.config import EngineConfig
from cadence.engine.client import AsyncEngineClient, request_submitted
from cadence.entrypoints.guards import Guard
from cadence.entrypoints.intake import IntakeGate, intake_limit
from cadence.entrypoints.streaming import sse_response, unless_disconnected
from cadence.sampling_params import SamplingParams

STREAM = "/v1/completions"  # FakeApp streams here until told to stop
ANSWER = "/v1/chat/completions"  # and answers at once here


class FakeApp:
    """An ASGI app whose requests do `intake_s` of intake, then (if `submits`) say their
    prompt was sent; on STREAM they then stream until `stream_done` is set."""

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
        if scope["path"] == STREAM:
            await self.stream_done.wait()


def http(path: str, method: str = "POST") -> dict:
    return {"type": "http", "method": method, "path": path, "headers": []}


async def call(gate: IntakeGate, scope: dict, sent: list | None = None) -> None:
    async def send(message):
        if sent is not None:
            sent.append(message)

    await gate(scope, None, send)


def test_at_most_the_limit_are_in_intake_and_streams_hold_no_place():
    async def main():
        app = FakeApp()
        gate = IntakeGate(app, limit=2)
        streams = [asyncio.create_task(call(gate, http(STREAM))) for _ in range(6)]
        await asyncio.sleep(0.2)  # 3 rounds of 2 intakes: every stream past the gate
        assert len(app.entered) == 6 and app.in_intake == 0
        assert app.most_in_intake == 2
        app.stream_done.set()
        await asyncio.gather(*streams)

    asyncio.run(main())


async def first_then_second(gate: IntakeGate, app: FakeApp) -> list[asyncio.Task]:
    """Two requests at once; returns once the first is in intake and the second waits."""
    tasks = [asyncio.create_task(call(gate, http(p))) for p in (ANSWER, "/v1/embeddings")]
    await asyncio.sleep(0.02)
    assert app.entered == [ANSWER]
    return tasks


def test_a_request_answered_without_the_engine_leaves_when_answered():
    async def main():
        app = FakeApp(intake_s=0.05, submits=False)
        gate = IntakeGate(app, limit=1, hold_max_s=10.0)
        await asyncio.gather(*await first_then_second(gate, app))
        assert app.entered == [ANSWER, "/v1/embeddings"]

    asyncio.run(main())


def test_a_slow_intake_gives_its_place_up_after_the_hold_limit():
    async def main():
        app = FakeApp(intake_s=5.0, submits=False)
        gate = IntakeGate(app, limit=1, hold_max_s=0.05)
        tasks = await first_then_second(gate, app)
        await asyncio.sleep(0.1)
        assert app.entered == [ANSWER, "/v1/embeddings"]  # the slow one kept it 0.05 s
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        assert gate.free_places == 1  # every place given back exactly once

    asyncio.run(main())


@pytest.mark.parametrize(
    "scope",
    [
        http("/v1/models", "GET"),
        http("/tokenize"),
        http("/v1/load_lora_adapter"),
        {"type": "websocket", "path": "/"},
    ],
)
def test_other_requests_never_wait_on_the_gate(scope):
    async def main():
        app = FakeApp(intake_s=0.0)
        gate = IntakeGate(app, limit=1, hold_max_s=10.0)
        busy = asyncio.create_task(call(gate, http(STREAM)))  # its place: taken
        await asyncio.sleep(0)
        app.submits = False
        await asyncio.wait_for(call(gate, scope), 1.0)
        assert app.entered[-1] == scope["path"]
        app.stream_done.set()
        await busy

    asyncio.run(main())


def test_a_request_let_in_after_the_drain_began_is_answered_503():
    async def main():
        draining = False
        app = FakeApp(intake_s=0.05, submits=False)
        gate = IntakeGate(app, draining=lambda: draining, limit=1, hold_max_s=10.0)
        sent: list = []
        first = asyncio.create_task(call(gate, http(ANSWER)))
        waiting = asyncio.create_task(call(gate, http(ANSWER), sent))
        await asyncio.sleep(0.01)
        draining = True  # SIGTERM while the second waits for its place
        await asyncio.gather(first, waiting)
        assert app.entered == [ANSWER]
        assert sent[0]["status"] == 503
        assert gate.free_places == 1

    asyncio.run(main())


def test_zero_turns_the_gate_off_and_a_bad_limit_is_refused(monkeypatch):
    monkeypatch.setenv("CADENCE_INTAKE_LIMIT", "0")
    assert IntakeGate(FakeApp()).places is None
    monkeypatch.setenv("CADENCE_INTAKE_LIMIT", "3")
    assert IntakeGate(FakeApp()).free_places == 3
    for bad in ("-1", "many", ""):
        monkeypatch.setenv("CADENCE_INTAKE_LIMIT", bad)
        with pytest.raises(ValueError, match="CADENCE_INTAKE_LIMIT"):
            intake_limit()


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


def test_the_hook_reaches_the_gate_through_fastapis_routes():
    """The server's own wiring: the gate inside the guard, and the hook called where the
    engine client would call it, under a streamed route (sse_response) and a non-streamed
    one (unless_disconnected runs it in a task of its own). With one place and a hold far
    longer than the test, a second request gets in only if the first's hook released it."""

    async def main():
        finish = asyncio.Event()
        entered: list[str] = []

        async def chunks():
            entered.append(STREAM)
            request_submitted.get()()  # what AsyncEngineClient.generate does once sent
            yield "data: 1\n\n"
            await finish.wait()
            yield "data: [DONE]\n\n"

        async def answer():
            entered.append(ANSWER)
            request_submitted.get()()
            await finish.wait()
            return {"ok": True}

        app = FastAPI()

        @app.post(STREAM)
        async def streamed():
            return await sse_response(chunks())

        @app.post(ANSWER)
        async def answered(request: Request):
            return await unless_disconnected(answer(), request)

        app.add_middleware(IntakeGate, limit=1, hold_max_s=60.0)
        app.add_middleware(Guard, api_key=None, admin_key=None, allowed_hosts=None,
                           metrics_public=True, max_body_bytes=1 << 20, body_timeout_s=10.0,
                           draining=lambda: False)  # fmt: skip
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as c:
            first = asyncio.create_task(c.post(STREAM))
            second = asyncio.create_task(c.post(ANSWER, json={}))
            third = asyncio.create_task(c.post(STREAM))
            await asyncio.sleep(0.5)
            assert sorted(entered) == sorted([STREAM, ANSWER, STREAM])  # each past the gate
            finish.set()
            replies = await asyncio.wait_for(asyncio.gather(first, second, third), 10.0)
        assert [r.status_code for r in replies] == [200, 200, 200]

    asyncio.run(main())


def test_the_server_puts_the_gate_inside_the_guard():
    from cadence.entrypoints.api_server import ServerOptions, create_app

    app = create_app(EngineConfig(), ServerOptions())
    assert [m.cls for m in app.user_middleware[:2]] == [Guard, IntakeGate]
