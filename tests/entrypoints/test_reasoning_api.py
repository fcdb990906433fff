"""Thinking apart from the answer (--reasoning-parser qwen3 on the shared server): SmolLM2
has no think tokens, so a regex forces `<think>...</think>` text and the parser splits it,
streamed and not; the Responses and Messages streams carry it as a reasoning item and a
thinking block, in the order their SDKs accumulate."""

from __future__ import annotations

import json

import openai
import pytest

from cadence.entrypoints.serving_messages import _Blocks
from cadence.entrypoints.serving_responses import _EventWriter, _Items

FORCED = {"structured_outputs": {"regex": r"<think>[a-z ]{5,40}</think>[A-Z][a-z ]{3,30}\."}}
QUESTION = [{"role": "user", "content": "Is the sky blue?"}]


def test_chat_splits_thinking_from_the_answer_streamed_and_not(client, model_name):
    kw = dict(model=model_name, messages=QUESTION, max_tokens=60, temperature=0, extra_body=FORCED)
    r = client.chat.completions.create(**kw)
    msg = r.choices[0].message
    thinking = msg.model_extra["reasoning_content"]
    assert thinking and "<think>" not in thinking and "</think>" not in thinking
    assert msg.model_extra["reasoning"] == thinking
    assert msg.content[0].isupper() and msg.content.endswith(".") and "think>" not in msg.content
    # The thinking's tokens, `</think>` included, are counted apart.
    thought = r.usage.completion_tokens_details.reasoning_tokens
    assert 0 < thought < r.usage.completion_tokens
    chunks = list(client.chat.completions.create(**kw, stream=True))
    streamed_thinking = "".join(
        (c.choices[0].delta.model_extra or {}).get("reasoning_content") or ""
        for c in chunks
        if c.choices
    )
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert (streamed_thinking, streamed) == (thinking, msg.content)


def test_without_a_think_block_everything_is_the_answer(client, model_name):
    r = client.chat.completions.create(
        model=model_name, messages=QUESTION, max_tokens=8, temperature=0
    )
    assert "reasoning_content" not in (r.choices[0].message.model_extra or {})
    assert r.choices[0].message.content
    assert r.usage.completion_tokens_details.reasoning_tokens == 0


def test_a_thinking_budget_that_cannot_be_kept_is_refused(client, model_name):
    # SmolLM2 spells <think> as text: thinking cannot be told from an answer's first tokens.
    with pytest.raises(openai.BadRequestError, match="max_thinking_tokens"):
        client.chat.completions.create(
            model=model_name,
            messages=QUESTION,
            max_tokens=8,
            extra_body={"max_thinking_tokens": 4},
        )


def _events(sse: list[str]) -> list[dict]:
    return [json.loads(line[6:]) for piece in sse for line in piece.split("\n") if line.startswith("data: ")]  # fmt: skip


def test_responses_stream_a_reasoning_item_before_the_message():
    items = _Items(_EventWriter())
    sse = [*items.feed([{"reasoning_content": "hm"}], []), *items.feed([{"reasoning_content": "m"}, {"content": "Yes."}], []), *items.close()]  # fmt: skip
    kinds = [e["type"] for e in _events(sse)]
    assert kinds == [
        "response.output_item.added", "response.content_part.added",
        "response.reasoning_text.delta", "response.reasoning_text.delta",
        "response.reasoning_text.done", "response.content_part.done", "response.output_item.done",
        "response.output_item.added", "response.content_part.added", "response.output_text.delta",
        "response.output_text.done", "response.content_part.done", "response.output_item.done",
    ]  # fmt: skip
    reasoning, message = items.done
    assert reasoning["type"] == "reasoning" and reasoning["content"][0]["text"] == "hmm"
    assert message["content"][0]["text"] == "Yes."
    assert [e["output_index"] for e in _events(sse)][-1] == 1


def test_messages_stream_a_thinking_block_before_the_text():
    from anthropic.lib.streaming._messages import accumulate_event
    from anthropic.types import RawMessageStartEvent

    blocks = _Blocks()
    sse = [*blocks.feed([{"reasoning_content": "hm"}, {"content": "Yes."}]), *blocks.close()]
    start = {"type": "message_start", "message": {"id": "msg_1", "type": "message", "role": "assistant", "model": "m", "content": [], "stop_reason": None, "stop_sequence": None, "usage": {"input_tokens": 1, "output_tokens": 0}}}  # fmt: skip
    snapshot = accumulate_event(event=RawMessageStartEvent.model_validate(start), current_snapshot=None, json_bufs={})  # fmt: skip
    from anthropic.types import RawMessageStreamEvent
    from pydantic import TypeAdapter

    adapter = TypeAdapter(RawMessageStreamEvent)
    for e in _events(sse):
        snapshot = accumulate_event(event=adapter.validate_python(e), current_snapshot=snapshot, json_bufs={})  # fmt: skip
    thinking, text = snapshot.content
    assert (thinking.type, thinking.thinking) == ("thinking", "hm")
    assert (text.type, text.text) == ("text", "Yes.")
