"""Structured outputs and tool calling over HTTP, with the official `openai` client and the
real SmolLM2 behind `cadence serve`: every output validates, streaming or not."""

from __future__ import annotations

import json
import re
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import jsonschema
import pytest

sys.path.insert(0, str(Path(__file__).parent.parent / "structured"))
from schema_cases import SCHEMA_CASES  # noqa: E402

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 40},
                "unit": {"enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city", "unit"],
        },
    },
}
TIME_TOOL = {
    "type": "function",
    "function": {
        "name": "get_time",
        "description": "Current time in a timezone",
        "parameters": {
            "type": "object",
            "properties": {"timezone": {"type": "string", "maxLength": 40}},
            "required": ["timezone"],
        },
    },
}


def messages(prompt: str) -> list[dict]:
    return [{"role": "user", "content": prompt + " Answer in JSON."}]


def schema_format(name: str, schema: dict) -> dict:
    return {"type": "json_schema", "json_schema": {"name": name, "schema": schema, "strict": True}}


def ask(client, model_name, case, stream: bool) -> tuple[str, str]:
    name, prompt, schema = case
    kwargs = dict(
        model=model_name,
        messages=messages(prompt),
        temperature=0,
        max_tokens=256,
        response_format=schema_format(name, schema),
    )
    if not stream:
        choice = client.chat.completions.create(**kwargs).choices[0]
        return choice.message.content, choice.finish_reason
    text, reason = "", None
    for chunk in client.chat.completions.create(stream=True, **kwargs):
        for c in chunk.choices:
            text += c.delta.content or ""
            reason = c.finish_reason or reason
    return text, reason


def ask_all(client, model_name, cases: list, stream: bool) -> list[tuple[str, str]]:
    with ThreadPoolExecutor(8) as pool:
        return list(pool.map(lambda c: ask(client, model_name, c, stream), cases))


# Over HTTP, every other schema case: tests/engine/test_structured.py runs them all through
# the same engine; here the response_format's path into it is what is tested.
HTTP_CASES = SCHEMA_CASES[::2]
STREAMED_CASES = range(0, len(HTTP_CASES), 2)  # and a spread of those streamed


@pytest.fixture(scope="module")
def whole_answers(client, model_name) -> list[tuple[str, str]]:
    """(text, finish reason) of each HTTP case, asked without streaming, once."""
    return ask_all(client, model_name, HTTP_CASES, stream=False)


def test_every_schema_validates(whole_answers):
    for (name, _, schema), (text, reason) in zip(HTTP_CASES, whole_answers):
        assert reason == "stop", (name, text)
        jsonschema.validate(json.loads(text), schema)


def test_streamed_schemas_equal_the_whole_answers(client, model_name, whole_answers):
    cases = [HTTP_CASES[i] for i in STREAMED_CASES]
    streamed = ask_all(client, model_name, cases, stream=True)
    assert streamed == [whole_answers[i] for i in STREAMED_CASES]


def test_json_object_mode(client, model_name):
    out = client.chat.completions.create(
        model=model_name,
        messages=[{"role": "user", "content": "Give me a JSON object about a cat."}],
        temperature=0,
        max_tokens=128,
        response_format={"type": "json_object"},
    )
    assert out.choices[0].finish_reason == "stop"
    assert isinstance(json.loads(out.choices[0].message.content), dict)


def test_vllm_style_fields_on_completions(client, model_name):
    def complete(extra: dict, prompt: str = "The product code is ") -> str:
        out = client.completions.create(
            model=model_name, prompt=prompt, temperature=0, max_tokens=40, extra_body=extra
        )
        assert out.choices[0].finish_reason == "stop"
        return out.choices[0].text

    assert re.fullmatch(r"[A-Z]{3}-\d{3}", complete({"guided_regex": r"[A-Z]{3}-\d{3}"}))
    assert complete({"guided_choice": ["red", "green"]}) in ("red", "green")
    assert re.fullmatch(
        r"(yes|no)!", complete({"structured_outputs": {"grammar": 'root ::= ("yes" | "no") "!"'}})
    )
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    jsonschema.validate(json.loads(complete({"guided_json": schema}, "A JSON number: ")), schema)
    text = complete(
        {"structured_outputs": {"json": schema, "any_whitespace": True, "max_whitespace": 2}}
    )
    jsonschema.validate(json.loads(text), schema)


def test_n_samples_streamed_each_valid(client, model_name):
    schema = SCHEMA_CASES[4][2]
    texts = {}
    for chunk in client.chat.completions.create(
        model=model_name,
        messages=messages("List some fruits."),
        n=2,
        temperature=1.0,
        seed=3,
        max_tokens=96,
        stream=True,
        response_format=schema_format("fruits", schema),
    ):
        for c in chunk.choices:
            texts[c.index] = texts.get(c.index, "") + (c.delta.content or "")
    assert sorted(texts) == [0, 1]
    for text in texts.values():
        jsonschema.validate(json.loads(text), schema)


def test_constrained_and_free_requests_together(client, model_name):
    def free():
        return (
            client.completions.create(
                model=model_name, prompt="Once upon a time", temperature=0, max_tokens=24
            )
            .choices[0]
            .text
        )

    alone = free()
    schema = SCHEMA_CASES[0][2]
    with ThreadPoolExecutor(6) as pool:
        frees = [pool.submit(free) for _ in range(3)]
        forced = [pool.submit(ask, client, model_name, SCHEMA_CASES[0], False) for _ in range(3)]
        assert [f.result() for f in frees] == [alone] * 3
        for f in forced:
            jsonschema.validate(json.loads(f.result()[0]), schema)


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"response_format": schema_format("x", {"type": "foo"})}, 'Unsupported type "foo"'),
        (
            {"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}},
            "needs json_schema.schema",
        ),
        ({"guided_regex": "(ab"}, "parenthesis is not closed"),
        (
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {
                        "name": "x",
                        "schema": {"type": "array", "uniqueItems": True},
                        "strict": True,
                    },
                }
            },
            "cannot enforce (strict): uniqueItems",
        ),
        ({"structured_outputs": {"grammar": "root ::= nothing"}}, 'Rule "nothing" is not defined'),
        ({"guided_choice": []}, "non-empty list"),
        ({"guided_regex": "a", "guided_choice": ["a"]}, "one output constraint"),
        ({"structured_outputs": {"regex": "a", "choice": ["a"]}}, "exactly one of"),
        ({"guided_json": "{not json"}, "not valid JSON"),
        (
            {
                "tools": [WEATHER_TOOL],
                "tool_choice": {"type": "function", "function": {"name": "nope"}},
            },
            "not in tools",
        ),
        ({"tool_choice": "required"}, "at least one tool"),
    ],
)
def test_bad_constraints_are_400s(http, model_name, body, message):
    r = http.post(
        "/v1/chat/completions",
        json={"model": model_name, "messages": [{"role": "user", "content": "hi"}], **body},
    )
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert message in err["message"]
    assert err["type"] == "invalid_request_error"


def test_engine_still_serves_after_bad_constraints(client, model_name):
    out = client.chat.completions.create(
        model=model_name, messages=[{"role": "user", "content": "hi"}], max_tokens=4
    )
    assert out.choices[0].message.content is not None


# ---- tool calling -----------------------------------------------------------------------


def check_weather_args(arguments: str) -> None:
    jsonschema.validate(json.loads(arguments), WEATHER_TOOL["function"]["parameters"])


def test_named_tool_choice_forces_a_valid_call(client, model_name):
    out = client.chat.completions.create(
        model=model_name,
        messages=[{"role": "user", "content": "What's the weather in Paris?"}],
        tools=[WEATHER_TOOL, TIME_TOOL],
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
        temperature=0,
        max_tokens=64,
    )
    msg = out.choices[0].message
    assert msg.content is None
    (call,) = msg.tool_calls
    assert call.type == "function" and call.function.name == "get_weather"
    assert call.id.startswith("call_")
    check_weather_args(call.function.arguments)


def test_required_tool_choice_forces_valid_calls_streamed_too(client, model_name):
    kwargs = dict(
        model=model_name,
        messages=[{"role": "user", "content": "What's the weather in Oslo?"}],
        tools=[WEATHER_TOOL, TIME_TOOL],
        tool_choice="required",
        temperature=0,
        max_tokens=128,
    )
    out = client.chat.completions.create(**kwargs)
    assert out.choices[0].finish_reason == "tool_calls"
    calls = out.choices[0].message.tool_calls
    assert calls
    streamed: dict[int, dict] = {}
    reason = None
    for chunk in client.chat.completions.create(stream=True, **kwargs):
        for c in chunk.choices:
            reason = c.finish_reason or reason
            for d in c.delta.tool_calls or []:
                entry = streamed.setdefault(d.index, {"name": "", "arguments": ""})
                entry["name"] += (d.function.name or "") if d.function else ""
                entry["arguments"] += (d.function.arguments or "") if d.function else ""
    assert reason == "tool_calls"
    assert [e["name"] for e in streamed.values()] == [c.function.name for c in calls]
    for call in calls:
        params = {"get_weather": WEATHER_TOOL, "get_time": TIME_TOOL}[call.function.name]
        jsonschema.validate(json.loads(call.function.arguments), params["function"]["parameters"])


def test_named_call_streams_arguments_as_deltas(client, model_name):
    pieces, ids = [], set()
    for chunk in client.chat.completions.create(
        model=model_name,
        messages=[{"role": "user", "content": "Weather in Rome, in celsius?"}],
        tools=[WEATHER_TOOL],
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
        temperature=0,
        max_tokens=64,
        stream=True,
    ):
        for c in chunk.choices:
            for d in c.delta.tool_calls or []:
                if d.id:
                    ids.add(d.id)
                pieces.append(d.function.arguments or "")
    assert len(ids) == 1 and len(pieces) > 1
    check_weather_args("".join(pieces))


# The model is too small to call tools on its own; a grammar makes it write the Hermes
# format, so "auto" parsing runs end to end through the server.
HERMES_GRAMMAR = (
    'root ::= "Checking.\\n<tool_call>\\n{\\"name\\": \\"get_weather\\", \\"arguments\\": '
    '{\\"city\\": \\"" [A-Z] [a-z]{2,8} "\\", \\"unit\\": \\"celsius\\"}}\\n</tool_call>"'
)


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_auto_tool_choice_parses_hermes_calls(client, model_name, stream):
    kwargs = dict(
        model=model_name,
        messages=[{"role": "user", "content": "What's the weather in Madrid?"}],
        tools=[WEATHER_TOOL],
        temperature=0,
        max_tokens=80,
        extra_body={"structured_outputs": {"grammar": HERMES_GRAMMAR}},
    )
    if not stream:
        choice = client.chat.completions.create(**kwargs).choices[0]
        content, calls, reason = (
            choice.message.content,
            choice.message.tool_calls,
            choice.finish_reason,
        )
        args = [c.function.arguments for c in calls]
    else:
        content, args, reason, names = "", [], None, []
        pieces = 0
        for chunk in client.chat.completions.create(stream=True, **kwargs):
            for c in chunk.choices:
                content += c.delta.content or ""
                reason = c.finish_reason or reason
                for d in c.delta.tool_calls or []:
                    pieces += 1
                    if d.function.name:  # a new call: its id and name, then its arguments
                        assert d.id and d.index == len(names)
                        names.append(d.function.name)
                        args.append("")
                    args[d.index] += d.function.arguments or ""
        assert names == ["get_weather"]
        assert pieces > 2  # the arguments streamed in pieces, as they were written
    assert content.strip() == "Checking."
    assert reason == "tool_calls"
    assert len(args) == 1
    check_weather_args(args[0])


def test_tool_results_round_trip_in_the_conversation(client, model_name):
    out = client.chat.completions.create(
        model=model_name,
        messages=[
            {"role": "user", "content": "Weather in Rome?"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "call_1",
                        "type": "function",
                        "function": {
                            "name": "get_weather",
                            "arguments": '{"city": "Rome", "unit": "celsius"}',
                        },
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "call_1", "content": '{"temperature": 21}'},
        ],
        tools=[WEATHER_TOOL],
        tool_choice="none",
        temperature=0,
        max_tokens=16,
    )
    assert out.choices[0].message.content
    assert not out.choices[0].message.tool_calls


def test_metrics_count_grammars_and_jump_forward(http):
    text = http.get("/metrics").text

    def value(name: str) -> float:
        line = next(ln for ln in text.splitlines() if ln.startswith(name + "{"))
        return float(line.rsplit(" ", 1)[1])

    assert value("cadence:structured_output_requests_total") >= len(SCHEMA_CASES)
    assert (
        0
        < value("cadence:grammar_compiles_total")
        <= value("cadence:structured_output_requests_total")
    )
    assert value("cadence:grammar_cache_hits_total") > 0  # each schema ran twice
    assert value("cadence:jump_forward_tokens_total") > 0
