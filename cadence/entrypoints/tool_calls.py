"""Tool calling on /v1/chat/completions: tools into the prompt, tool calls out of the text.

    tool_choice   prompt                output                          parsed as
    "none"        no tools              free text                       content
    "auto"        tools (template)      free; may hold calls            the model's format
    "required"    tools                 JSON array of {name, arguments} (grammar)  that array
    {function}    tools                 that function's arguments (grammar)       one call

In "auto" the calls are read in the model's own format by the tool-call parser
(`tool_parsers/`, `--tool-call-parser`). A chat template that knows tools (it mentions
`tools`) renders them itself; for one that does not (SmolLM2's),
`render_without_template_support` writes the tool list into the system message, with
Hermes `<tool_call>` instructions, and earlier calls / results into the conversation as text.
"""

from __future__ import annotations

import functools
import json
import logging
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from cadence.entrypoints.tool_parsers import (
    ToolCall,
    ToolCallDelta,
    ToolParser,
    parse_tool_calls,
    tool_parser_factory,
)
from cadence.entrypoints.tool_parsers.base import arguments_object, new_call_id
from cadence.entrypoints.tool_parsers.hermes import CLOSE as TOOL_CALL_CLOSE
from cadence.entrypoints.tool_parsers.hermes import OPEN as TOOL_CALL_OPEN
from cadence.entrypoints.tool_parsers.hermes import HermesToolParser
from cadence.entrypoints.tool_parsers.json_array import JsonArrayToolParser
from cadence.sampling_params import StructuredOutputsParams
from cadence.structured.grammar import normalize_schema, runtime_schema
from cadence.structured.schema_rules import inline_refs

logger = logging.getLogger("cadence.api")


class FunctionDefinition(BaseModel):
    model_config = ConfigDict(extra="ignore")
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class ChatTool(BaseModel):
    model_config = ConfigDict(extra="ignore")
    type: Literal["function"] = "function"
    function: FunctionDefinition


class NamedFunction(BaseModel):
    name: str


class NamedToolChoice(BaseModel):
    model_config = ConfigDict(extra="ignore")
    type: Literal["function"] = "function"
    function: NamedFunction


ToolChoice = Literal["none", "auto", "required"] | NamedToolChoice


@dataclass
class ToolPlan:
    """How one request uses its tools."""

    mode: Literal["none", "auto", "required", "named"]
    tools: list[ChatTool]
    function_name: str | None = None  # mode "named"
    parallel: bool = True  # parallel_tool_calls: False keeps the first call only
    parser: type[ToolParser] = HermesToolParser  # reads "auto" answers

    def new_parser(self, incremental: bool = True) -> ToolParser:
        parameters = {t.function.name: _parameters(t.function) for t in self.tools}
        return self.parser(parameters, incremental=incremental)

    @property
    def in_prompt(self) -> bool:
        return self.mode != "none" and bool(self.tools)

    @functools.cached_property
    def forced_in_format(self) -> bool:
        """A forced call ("required" / "named") is written in the model's own format (its
        parser then reads it), not as JSON: the format's markers are text a grammar can
        write, and the grammar enforces every tool's arguments whole (no run-time checks,
        which follow JSON only)."""
        if self.mode not in ("required", "named") or self.parser.call_text("f") is None:
            return False
        return not any(
            runtime_schema(StructuredOutputsParams(json=_parameters(t.function))) is not None
            for t in self._forced_tools()
        )

    def _forced_tools(self) -> list[ChatTool]:
        if self.mode == "named":
            return [t for t in self.tools if t.function.name == self.function_name]
        return self.tools

    def constraint(self) -> StructuredOutputsParams | None:
        """The grammar that forces a call ("required" / "named"), else None."""
        if self.forced_in_format:
            return StructuredOutputsParams(structural_tag=self._structural_tag())
        if self.mode == "named":
            fn = next(t.function for t in self.tools if t.function.name == self.function_name)
            return StructuredOutputsParams(json=_parameters(fn), strict=bool(fn.strict))
        if self.mode == "required":
            calls = [
                {
                    "type": "object",
                    "properties": {
                        "name": {"type": "string", "enum": [t.function.name]},
                        "arguments": _parameters(t.function),
                    },
                    "required": ["name", "arguments"],
                }
                for t in self.tools
            ]
            schema: dict[str, Any] = {
                "type": "array",
                "items": calls[0] if len(calls) == 1 else {"anyOf": calls},
                "minItems": 1,
            }
            if not self.parallel:
                schema["maxItems"] = 1
            strict = any(t.function.strict for t in self.tools)
            return StructuredOutputsParams(json=schema, strict=strict)
        return None

    def _structural_tag(self) -> str:
        """One or more calls (one: "named", or parallel_tool_calls false) in the format."""
        tags = []
        for t in self._forced_tools():
            begin, end = self.parser.call_text(t.function.name)
            schema = normalize_schema(inline_refs(_parameters(t.function)))
            content = {"type": "json_schema", "json_schema": schema}
            tags.append({"type": "tag", "begin": begin, "content": content, "end": end})
        forced = {
            "type": "tags_with_separator",
            "tags": tags,
            "separator": self.parser.call_separator,
            "at_least_one": True,
            "stop_after_first": self.mode == "named" or not self.parallel,
        }
        return json.dumps({"type": "structural_tag", "format": forced}, ensure_ascii=False)


def _parameters(fn: FunctionDefinition) -> dict[str, Any]:
    return fn.parameters if fn.parameters else {"type": "object", "properties": {}}


def plan_tools(
    tools: list[ChatTool] | None,
    tool_choice: ToolChoice | None,
    parallel: bool = True,
    parser: type[ToolParser] = HermesToolParser,
) -> ToolPlan:
    """Check tools against tool_choice. Raises ValueError saying what is wrong."""
    tools = tools or []
    names = [t.function.name for t in tools]
    if len(set(names)) != len(names):
        raise ValueError("tool function names must be unique")
    if tool_choice is None:
        tool_choice = "auto" if tools else "none"
    if isinstance(tool_choice, NamedToolChoice):
        name = tool_choice.function.name
        if name not in names:
            raise ValueError(f"tool_choice names function {name!r}, which is not in tools")
        return ToolPlan("named", tools, name, parallel, parser)
    if not tools:
        if tool_choice == "required":
            raise ValueError('tool_choice "required" needs at least one tool in tools')
        tool_choice = "none"
    return ToolPlan(tool_choice, tools, parallel=parallel, parser=parser)


def template_supports_tools(tokenizer) -> bool:
    template = getattr(tokenizer, "chat_template", None)
    if isinstance(template, dict):
        template = " ".join(template.values())
    return bool(template) and "tools" in template


def choose_tool_parser(name: str, tokenizer) -> type[ToolParser]:
    """The parser for --tool-call-parser `name` and this tokenizer's chat template. A
    template that does not know tools gets cadence's Hermes instructions: Hermes it is."""
    if tokenizer is None or not template_supports_tools(tokenizer):
        if name not in ("auto", "hermes"):
            logger.warning(
                "--tool-call-parser %s: the chat template does not render tools, so tools "
                "are described with Hermes <tool_call> instructions and read as Hermes",
                name,
            )
        return HermesToolParser
    template = tokenizer.chat_template
    if isinstance(template, dict):
        template = " ".join(template.values())
    parser = tool_parser_factory(name, template)
    logger.info("tool calls are read as %s", parser.__name__)
    return parser


def tools_for_template(tools: list[ChatTool]) -> list[dict]:
    return [t.model_dump(exclude_none=True) for t in tools]


def conversation_for_template(messages: list[dict]) -> list[dict]:
    """Assistant tool calls with their arguments as objects (for templates that know tools)."""
    out = []
    for m in messages:
        if m.get("tool_calls"):
            m = dict(m)
            m["tool_calls"] = [
                {
                    **c,
                    "function": {
                        **c["function"],
                        "arguments": arguments_object(c["function"].get("arguments")),
                    },
                }
                for c in m["tool_calls"]
            ]
        out.append(m)
    return out


def tool_system_prompt(tools: list[ChatTool]) -> str:
    lines = "\n".join(
        json.dumps(t.model_dump(exclude_none=True), ensure_ascii=False) for t in tools
    )
    return (
        "You can call functions to help answer. These are the functions available, as JSON "
        f"signatures between <tools> and </tools>:\n<tools>\n{lines}\n</tools>\n\n"
        "To call a function, answer with a JSON object holding its name and its arguments, "
        "between <tool_call> and </tool_call>:\n"
        '<tool_call>\n{"name": "function name", "arguments": {"argument": "value"}}\n</tool_call>'
    )


def render_without_template_support(
    messages: list[dict], tools: list[ChatTool] | None
) -> list[dict]:
    """The conversation as plain system / user / assistant text, tools spelled out."""
    out: list[dict] = []
    for m in messages:
        role, content = m["role"], m.get("content") or ""
        if role == "assistant" and m.get("tool_calls"):
            blocks = [
                TOOL_CALL_OPEN
                + "\n"
                + json.dumps(
                    {
                        "name": c["function"]["name"],
                        "arguments": arguments_object(c["function"].get("arguments")),
                    },
                    ensure_ascii=False,
                )
                + "\n"
                + TOOL_CALL_CLOSE
                for c in m["tool_calls"]
            ]
            content = "\n".join(([content] if content else []) + blocks)
            out.append({"role": "assistant", "content": content})
        elif role == "tool":
            out.append({"role": "user", "content": f"<tool_response>\n{content}\n</tool_response>"})
        else:
            out.append({"role": role, "content": content})
    if tools:
        prompt = tool_system_prompt(tools)
        if out and out[0]["role"] in ("system", "developer"):
            out[0] = {"role": out[0]["role"], "content": f"{out[0]['content']}\n\n{prompt}".strip()}
        else:
            out.insert(0, {"role": "system", "content": prompt})
    return out


# ---- parsing the model's output -------------------------------------------------------


def parse_required(text: str) -> list[ToolCall]:
    """The JSON array a "required" grammar produced."""
    return parse_tool_calls(JsonArrayToolParser(incremental=False), text)[1]


def finish_reason(plan: ToolPlan, calls: list[ToolCall], reason: str | None) -> str | None:
    """OpenAI's: "tool_calls" when the model chose to call (auto / required) and stopped."""
    if calls and plan.mode in ("auto", "required") and reason == "stop":
        return "tool_calls"
    return reason


def message_from_output(plan: ToolPlan, text: str) -> tuple[dict, list[ToolCall]]:
    """The assistant message of a finished sample, and the calls in it."""
    calls: list[ToolCall] = []
    content: str | None = text
    if plan.mode == "auto" or plan.forced_in_format:
        content, calls = parse_tool_calls(plan.new_parser(incremental=False), text)
        if not calls and plan.mode == "named":  # cut short (max_tokens) inside the call
            content, calls = None, [_cut_named_call(plan, text)]
    elif plan.mode == "required":
        calls = parse_required(text)
    elif plan.mode == "named":
        calls = [ToolCall(plan.function_name, text)]
    if not plan.parallel:
        calls = calls[:1]
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if calls:
        message["content"] = (content or None) if plan.mode == "auto" else None
        message["tool_calls"] = [c.to_openai() for c in calls]
    return message, calls


def _cut_named_call(plan: ToolPlan, text: str) -> ToolCall:
    """A forced call in the model's format that ended before its arguments did: the
    arguments written so far (what parses of them is the client's to take)."""
    begin, _ = plan.parser.call_text(plan.function_name)
    return ToolCall(plan.function_name, text[len(begin) :] if text.startswith(begin) else "")


class ToolCallStream:
    """One streamed sample's deltas: content, or tool calls as OpenAI's `tool_calls` deltas
    (a call's first delta carries its id and name, the next ones more of its arguments)."""

    def __init__(self, plan: ToolPlan) -> None:
        self.plan = plan
        self.parser: ToolParser | None = None
        if plan.mode == "auto" or plan.forced_in_format:
            self.parser = plan.new_parser()
        elif plan.mode == "required":
            self.parser = JsonArrayToolParser()
        self.calls: list[ToolCall] = []  # so far, arguments included
        self.text = ""  # all of it (a forced call cut short is read from it at the end)
        self.blank = ""  # whitespace held back: only content if more content follows

    def feed(self, text: str) -> list[dict]:
        self.text += text
        if self.parser is not None:
            return self._deltas(self.parser.feed(text))
        if self.plan.mode == "named":
            if not text:
                return []
            if not self.calls:
                return self._deltas(
                    [ToolCallDelta(0, text, new_call_id(), self.plan.function_name)]
                )
            return self._deltas([ToolCallDelta(0, text)])
        return [{"content": text}] if text else []

    def finish(self) -> list[dict]:
        if self.parser is None:
            return []
        pieces = self.parser.finish()
        forced = self.plan.forced_in_format and self.plan.mode == "named"
        if forced and not self.calls and not any(isinstance(p, ToolCallDelta) for p in pieces):
            call = _cut_named_call(self.plan, self.text)  # (its text is no answer)
            pieces = [ToolCallDelta(0, call.arguments, call.id, call.name)]
        out = self._deltas(pieces)
        if self.blank and not self.calls:
            out.append({"content": self.blank})
        return out

    def _deltas(self, pieces: list) -> list[dict]:
        out: list[dict] = []
        for p in pieces:
            if isinstance(p, str) and not p.strip():
                self.blank += p  # (between calls, around them: not a message of its own)
            elif isinstance(p, str):
                out.append({"content": self.blank + p})
                self.blank = ""
            elif p.index > 0 and not self.plan.parallel:
                continue  # parallel_tool_calls false: the first call only
            elif p.index < len(self.calls):
                self.calls[p.index].arguments += p.arguments
                out.append(
                    {"tool_calls": [{"index": p.index, "function": {"arguments": p.arguments}}]}
                )
            else:
                call = ToolCall(p.name or "", p.arguments, p.id or new_call_id())
                self.calls.append(call)
                out.append({"tool_calls": [call.to_openai(index=p.index)]})
        return out
