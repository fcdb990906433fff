"""What the router routes by: each API's conversation, read plainly from the body, so
requests that share a system prompt or earlier turns share a key prefix whatever the API."""

from __future__ import annotations

from cadence.router.app import prompt_text


def test_each_api_keys_on_its_conversation():
    chat = prompt_text(
        "/v1/chat/completions",
        {"messages": [{"role": "system", "content": "S"}, {"role": "user", "content": "Q"}]},
    )
    responses = prompt_text(
        "/v1/responses",
        {"instructions": "S", "input": [{"role": "user", "content": [{"type": "input_text", "text": "Q"}]}]},
    )  # fmt: skip
    messages = prompt_text(
        "/v1/messages",
        {"system": [{"type": "text", "text": "S"}], "messages": [{"role": "user", "content": "Q"}]},
    )
    assert chat == "system: S\nuser: Q"
    assert responses == messages == "S\nuser: Q"
    assert prompt_text("/v1/responses", {"input": "Q"}) == "user: Q"
    assert prompt_text("/v1/embeddings", {"input": ["Q", "R"]}) == "Q"  # the first, as prompts
    assert prompt_text("/v1/embeddings", {"input": [5, 6]}) == [5, 6]


def test_any_shape_gives_a_key():
    for path in ("/v1/responses", "/v1/messages", "/v1/chat/completions", "/v1/embeddings"):
        for body in ({}, {"input": 3, "messages": "x", "system": 5}, {"messages": [1, None]}):
            assert isinstance(prompt_text(path, body), str)


def test_a_broken_stream_ends_in_its_apis_error_shape():
    """The router's mid-stream error, as each API's client reads one."""
    import json

    from cadence.router.relay import sse_error

    chat = sse_error("gone", "/v1/chat/completions").decode()
    assert chat.endswith("data: [DONE]\n\n") and json.loads(chat.split("\n")[0][6:])["error"]
    anthropic = sse_error("gone", "/v1/messages").decode().split("\n")
    assert anthropic[0] == "event: error"
    assert json.loads(anthropic[1][6:]) == {
        "type": "error",
        "error": {"type": "api_error", "message": "gone"},
    }
    responses = sse_error("gone", "/v1/responses").decode().split("\n")
    assert responses[0] == "event: error" and json.loads(responses[1][6:])["type"] == "error"
