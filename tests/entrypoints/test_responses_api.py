"""POST /v1/responses with the official `openai` client (`responses.create`,
`responses.stream`, `responses.parse`) against the real SmolLM2 behind `cadence serve`: the
same answer as chat completions for the same conversation, the typed events in order,
tools, JSON schemas that validate, the response store, errors in OpenAI's shape."""

from __future__ import annotations

import json

import jsonschema
import openai
import pytest
from pydantic import BaseModel

QUESTION = "Name three colours of the rainbow."
WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "Current weather in a city",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 30}},
        "required": ["city"],
    },
}
TIME = {"type": "function", "name": "get_time", "parameters": {"type": "object", "properties": {}}}


def chat_text(client, model_name, messages, max_tokens=24) -> tuple[str, str]:
    r = client.chat.completions.create(
        model=model_name, messages=messages, max_tokens=max_tokens, temperature=0
    )
    return r.choices[0].message.content, r.choices[0].finish_reason


def test_text_answer_equals_chat_for_the_same_conversation(client, model_name):
    r = client.responses.create(
        model=model_name,
        instructions="Answer in a few words.",
        input=QUESTION,
        max_output_tokens=24,
        temperature=0,
    )
    want, finish = chat_text(
        client,
        model_name,
        [
            {"role": "system", "content": "Answer in a few words."},
            {"role": "user", "content": QUESTION},
        ],
    )
    assert r.object == "response" and r.id.startswith("resp_")
    assert r.output_text == want
    (item,) = r.output
    assert item.type == "message" and item.role == "assistant" and item.id.startswith("msg_")
    assert r.status == ("incomplete" if finish == "length" else "completed")
    assert r.usage.output_tokens <= 24 and r.usage.input_tokens > 10
    assert r.usage.total_tokens == r.usage.input_tokens + r.usage.output_tokens
    assert r.model == model_name and r.instructions == "Answer in a few words."


def test_max_output_tokens_makes_it_incomplete(client, model_name):
    r = client.responses.create(model=model_name, input=QUESTION, max_output_tokens=3)
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
    assert r.usage.output_tokens == 3


def test_stream_events_in_order_and_equal_to_the_whole(client, model_name):
    kwargs = dict(model=model_name, input=QUESTION, max_output_tokens=40, temperature=0)
    whole = client.responses.create(**kwargs)
    with client.responses.stream(**kwargs) as stream:
        events = list(stream)
    kinds = [e.type for e in events]
    assert kinds[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    last = "response.completed" if whole.status == "completed" else "response.incomplete"
    assert kinds[-4:] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        last,
    ]
    assert set(kinds[4:-4]) == {"response.output_text.delta"}
    assert [e.sequence_number for e in events] == list(range(len(events)))
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == whole.output_text
    final = events[-1].response
    assert final.output[0].content[0].text == text and final.status == whole.status
    assert final.usage.output_tokens == whole.usage.output_tokens
    assert events[0].response.id == final.id and events[0].response.status == "in_progress"


def test_stream_helper_gives_the_final_response(client, model_name):
    with client.responses.stream(
        model=model_name, input="Say OK.", max_output_tokens=200, temperature=0,
        text={"format": {"type": "json_schema", "name": "ok", "strict": True, "schema": {
            "type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
            "additionalProperties": False}}},
    ) as stream:  # fmt: skip
        final = stream.get_final_response()
    assert final.status == "completed"
    assert json.loads(final.output_text)["ok"] in (True, False)


def test_required_tool_call_streamed_and_not(client, model_name):
    kwargs = dict(
        model=model_name,
        input="What is the weather in Paris?",
        tools=[WEATHER, TIME],
        tool_choice="required",
        temperature=0,
        max_output_tokens=80,
    )
    r = client.responses.create(**kwargs)
    calls = [o for o in r.output if o.type == "function_call"]
    assert calls and r.status == "completed"
    for c in calls:
        assert c.name in ("get_weather", "get_time") and c.call_id.startswith("call_")
        args = json.loads(c.arguments)
        if c.name == "get_weather":
            jsonschema.validate(args, WEATHER["parameters"])
    with client.responses.stream(**kwargs) as stream:
        events = list(stream)
        final = stream.get_final_response()
    streamed = [o for o in final.output if o.type == "function_call"]
    assert [(c.name, c.arguments) for c in streamed] == [(c.name, c.arguments) for c in calls]
    added = [e.item.type for e in events if e.type == "response.output_item.added"]
    assert added == ["function_call"] * len(calls)


def test_named_tool_streams_its_arguments(client, model_name):
    with client.responses.stream(
        model=model_name,
        input="Weather in Oslo?",
        tools=[WEATHER],
        tool_choice={"type": "function", "name": "get_weather"},
        temperature=0,
        max_output_tokens=60,
    ) as stream:
        events = list(stream)
        final = stream.get_final_response()
    deltas = [e.delta for e in events if e.type == "response.function_call_arguments.delta"]
    assert len(deltas) > 1  # incremental, not one blob at the end
    (call,) = final.output
    assert call.type == "function_call" and "".join(deltas) == call.arguments
    jsonschema.validate(json.loads(call.arguments), WEATHER["parameters"])
    done = next(e for e in events if e.type == "response.function_call_arguments.done")
    assert done.arguments == call.arguments


def test_logprobs_ride_on_text_only_even_beside_tool_calls(client, model_name):
    """Logprobs are the output text's: a named call with them on streams its arguments
    whole, and the answer holds no empty message beside the call."""
    kwargs = dict(
        model=model_name,
        input="Weather in Oslo?",
        tools=[WEATHER],
        tool_choice={"type": "function", "name": "get_weather"},
        include=["message.output_text.logprobs"],
        top_logprobs=2,
        temperature=0,
        max_output_tokens=60,
    )
    whole = client.responses.create(**kwargs)
    with client.responses.stream(**kwargs) as stream:
        final = stream.get_final_response()
    for r in (whole, final):
        (call,) = r.output
        assert call.type == "function_call"
        jsonschema.validate(json.loads(call.arguments), WEATHER["parameters"])
    assert final.output[0].arguments == whole.output[0].arguments
    text = client.responses.create(
        model=model_name, input=QUESTION, top_logprobs=2, max_output_tokens=6, temperature=0
    )
    lps = text.output[0].content[0].logprobs
    assert len(lps) == 6 and all(len(lp.top_logprobs) == 2 for lp in lps)
    assert "".join(lp.token for lp in lps) == text.output_text


class Colour(BaseModel):
    name: str
    warm: bool


def test_parse_with_a_pydantic_schema(client, model_name):
    r = client.responses.parse(
        model=model_name,
        input="Give a colour as JSON.",
        text_format=Colour,
        max_output_tokens=120,
        temperature=0,
    )
    assert r.status == "completed"
    assert isinstance(r.output_parsed, Colour)


def test_conversation_items_with_a_tool_round_trip(client, model_name):
    call = {"name": "get_weather", "arguments": '{"city": "Paris"}'}
    items = [
        {"role": "user", "content": "What is the weather in Paris?"},
        {"type": "function_call", "call_id": "call_1", **call},
        {"type": "function_call_output", "call_id": "call_1", "output": "Sunny, 21 C"},
        {"role": "user", "content": [{"type": "input_text", "text": "So, is it warm?"}]},
    ]
    r = client.responses.create(
        model=model_name, input=items, tools=[WEATHER], max_output_tokens=16, temperature=0
    )
    messages = [
        items[0],
        {
            "role": "assistant",
            "tool_calls": [{"id": "call_1", "type": "function", "function": call}],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "Sunny, 21 C"},
        {"role": "user", "content": "So, is it warm?"},
    ]
    tool = {"type": "function", "function": {k: v for k, v in WEATHER.items() if k != "type"}}
    chat = client.chat.completions.create(
        model=model_name, messages=messages, tools=[tool], max_tokens=16, temperature=0
    )
    assert r.usage.input_tokens == chat.usage.prompt_tokens
    texts = [o.content[0].text for o in r.output if o.type == "message"]
    assert "".join(texts) == (chat.choices[0].message.content or "")


def test_previous_response_id_continues_a_stored_conversation(client, model_name):
    first = client.responses.create(
        model=model_name, instructions="Be brief.", input="My name is Ada.", max_output_tokens=8
    )
    assert first.store is True
    second = client.responses.create(
        model=model_name,
        input="What is my name?",
        previous_response_id=first.id,
        max_output_tokens=8,
    )
    assert second.previous_response_id == first.id
    # The second prompt holds the first turn (its input and answer) but not its instructions.
    alone = client.responses.create(model=model_name, input="What is my name?", max_output_tokens=8)
    assert second.usage.input_tokens > alone.usage.input_tokens + 5
    assert client.responses.retrieve(second.id).output_text == second.output_text
    unstored = client.responses.create(
        model=model_name, input="hi", store=False, max_output_tokens=2
    )
    assert unstored.store is False
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(unstored.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.create(
            model=model_name, input="x", previous_response_id="resp_" + "0" * 32
        )
    client.responses.delete(second.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(second.id)


@pytest.mark.parametrize(
    "extra, needle",
    [
        ({"tools": [{"type": "web_search"}]}, "function tools only"),
        ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]}, "does not take images"),
        ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "item_reference"),
        ({"input": [{"type": "function_call_output", "output": "x"}]}, "call_id"),
        ({"tool_choice": "required"}, "at least one tool"),
        ({"max_output_tokens": 0}, "max_output_tokens"),
        ({"text": {"format": {"type": "json_schema", "name": "x"}}}, "schema"),
    ],
)  # fmt: skip
def test_bad_requests_are_400_error_objects(http, model_name, extra, needle):
    body = {"model": model_name, "input": "hi", "max_output_tokens": 4, **extra}
    r = http.post("/v1/responses", json=body)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert needle in err["message"] and err["type"] == "invalid_request_error"


def test_unknown_model_is_a_404(client):
    with pytest.raises(openai.NotFoundError):
        client.responses.create(model="gpt-nope", input="hi")


def test_wire_events_are_named_and_numbered(http, model_name):
    body = {"model": model_name, "input": "hi", "max_output_tokens": 3, "stream": True}
    with http.stream("POST", "/v1/responses", json=body) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        lines = [line for line in r.iter_lines() if line]
    names = [line[7:] for line in lines if line.startswith("event: ")]
    datas = [json.loads(line[6:]) for line in lines if line.startswith("data: ")]
    assert names == [d["type"] for d in datas] and names[0] == "response.created"
    assert names[-1] == "response.incomplete"
