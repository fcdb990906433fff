"""Tool calling on /v1/chat/completions: tools into the prompt, tool calls out of the text.

    tool_choice   prompt                output                          parsed as
    "none"        no tools              free text                       content
    "auto"        tools (template)      free; may hold <tool_call>      Hermes blocks
    "required"    tools                 JSON array of {name, arguments} (grammar)  that array
    {function}    tools                 that function's arguments (grammar)       one call

The model's format is the Hermes / Qwen one: `<tool_call>{"name": ..., "arguments": {...}}
</tool_call>`. A chat template that knows tools (it mentions `tools`) renders them itself;
for one that does not (SmolLM2's), `render_without_template_support` writes the tool list
into the system message and earlier calls / results into the conversation as text.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from cadence.entrypoints.reasoning.base import partial_suffix
from cadence.sampling_params import StructuredOutputsParams

TOOL_CALL_OPEN = "<tool_call>"
TOOL_CALL_CLOSE = "</tool_call>"
_BLOCK = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)


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


def new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


@dataclass
class ToolCall:
    name: str
    arguments: str  # JSON text of an object
    id: str = field(default_factory=new_call_id)

    def to_openai(self, index: int | None = None) -> dict:
        out: dict[str, Any] = {
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        }
        if index is not None:
            out["index"] = index
        return out


@dataclass
class ToolPlan:
    """How one request uses its tools."""

    mode: Literal["none", "auto", "required", "named"]
    tools: list[ChatTool]
    function_name: str | None = None  # mode "named"
    parallel: bool = True  # parallel_tool_calls: False keeps the first call only

    @property
    def in_prompt(self) -> bool:
        return self.mode != "none" and bool(self.tools)

    def constraint(self) -> StructuredOutputsParams | None:
        """The grammar that forces a call ("required" / "named"), else None."""
        if self.mode == "named":
            fn = next(t.function for t in self.tools if t.function.name == self.function_name)
            return StructuredOutputsParams(json=_parameters(fn))
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
            return StructuredOutputsParams(json=schema)
        return None


def _parameters(fn: FunctionDefinition) -> dict[str, Any]:
    return fn.parameters if fn.parameters else {"type": "object", "properties": {}}


def plan_tools(
    tools: list[ChatTool] | None, tool_choice: ToolChoice | None, parallel: bool = True
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
        return ToolPlan("named", tools, name, parallel)
    if not tools:
        if tool_choice == "required":
            raise ValueError('tool_choice "required" needs at least one tool in tools')
        tool_choice = "none"
    return ToolPlan(tool_choice, tools, parallel=parallel)


def template_supports_tools(tokenizer) -> bool:
    template = getattr(tokenizer, "chat_template", None)
    if isinstance(template, dict):
        template = " ".join(template.values())
    return bool(template) and "tools" in template


def tools_for_template(tools: list[ChatTool]) -> list[dict]:
    return [t.model_dump(exclude_none=True) for t in tools]


def _arguments_object(arguments: Any) -> Any:
    """Templates expect a call's arguments as a mapping; OpenAI sends JSON text."""
    if isinstance(arguments, str):
        try:
            return json.loads(arguments)
        except json.JSONDecodeError:
            return arguments
    return arguments


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
                        "arguments": _arguments_object(c["function"].get("arguments")),
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
                        "arguments": _arguments_object(c["function"].get("arguments")),
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


def _call_from_json(text: str) -> ToolCall | None:
    try:
        return _call_from_object(json.loads(text))
    except json.JSONDecodeError:
        return None


def _call_from_object(obj) -> ToolCall | None:
    """{"name": ..., "arguments": {...}} (or "parameters", or arguments as JSON text)."""
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    args = obj.get("arguments", obj.get("parameters", {}))
    args = _arguments_object(args)
    if not isinstance(args, dict):
        return None
    return ToolCall(obj["name"], json.dumps(args, ensure_ascii=False))


def parse_hermes(text: str) -> tuple[str, list[ToolCall]]:
    """(content outside the tool-call blocks, the calls). A block that does not parse
    stays in the content; an unclosed last block is tried as if it were closed."""
    calls: list[ToolCall] = []
    content: list[str] = []
    pos = 0
    for m in _BLOCK.finditer(text):
        call = _call_from_json(m.group(1))
        if call is None:
            continue
        content.append(text[pos : m.start()])
        calls.append(call)
        pos = m.end()
    rest = text[pos:]
    open_at = rest.rfind(TOOL_CALL_OPEN)  # the last one: earlier bad blocks stay text
    if open_at >= 0:
        call = _call_from_json(rest[open_at + len(TOOL_CALL_OPEN) :].strip())
        if call is not None:
            calls.append(call)
            rest = rest[:open_at]
    content.append(rest)
    return "".join(content).strip() if calls else text, calls


def parse_required(text: str) -> list[ToolCall]:
    """The JSON array a "required" grammar produced."""
    try:
        items = json.loads(text)
    except json.JSONDecodeError:
        return []
    calls = []
    for item in items if isinstance(items, list) else []:
        call = _call_from_object(item)
        if call is not None:
            calls.append(call)
    return calls


class HermesStreamParser:
    """Splits streamed text into content deltas and complete tool calls.

    Text that might be the start of `<tool_call>` is held back until it is clearly not;
    inside a block everything is buffered until `</tool_call>`, then one call comes out."""

    def __init__(self) -> None:
        self.pending = ""  # held back: a possible tag prefix, or an open block
        self.in_call = False
        self.num_calls = 0

    def feed(self, delta: str) -> tuple[str, list[ToolCall]]:
        self.pending += delta
        content, calls = "", []
        while True:
            if self.in_call:
                end = self.pending.find(TOOL_CALL_CLOSE)
                if end < 0:
                    break
                body = self.pending[:end]
                self.pending = self.pending[end + len(TOOL_CALL_CLOSE) :]
                self.in_call = False
                call = _call_from_json(body.strip())
                if call is None:  # not a call after all: give it back as text
                    content += TOOL_CALL_OPEN + body + TOOL_CALL_CLOSE
                else:
                    calls.append(call)
                    self.num_calls += 1
                continue
            start = self.pending.find(TOOL_CALL_OPEN)
            if start >= 0:
                content += self.pending[:start]
                self.pending = self.pending[start + len(TOOL_CALL_OPEN) :]
                self.in_call = True
                continue
            keep = partial_suffix(self.pending, TOOL_CALL_OPEN)
            content += self.pending[: len(self.pending) - keep]
            self.pending = self.pending[len(self.pending) - keep :]
            break
        return content, calls

    def finish(self) -> tuple[str, list[ToolCall]]:
        """At the end of the output: an unclosed block is tried as a call, else text."""
        rest, self.pending = self.pending, ""
        if self.in_call:
            self.in_call = False
            call = _call_from_json(rest.strip())
            if call is not None:
                self.num_calls += 1
                return "", [call]
            return TOOL_CALL_OPEN + rest, []
        return rest, []


def finish_reason(plan: ToolPlan, calls: list[ToolCall], reason: str | None) -> str | None:
    """OpenAI's: "tool_calls" when the model chose to call (auto / required) and stopped."""
    if calls and plan.mode in ("auto", "required") and reason == "stop":
        return "tool_calls"
    return reason


def message_from_output(plan: ToolPlan, text: str) -> tuple[dict, list[ToolCall]]:
    """The assistant message of a finished sample, and the calls in it."""
    calls: list[ToolCall] = []
    content: str | None = text
    if plan.mode == "auto":
        content, calls = parse_hermes(text)
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


class ToolCallStream:
    """One streamed sample's deltas: content, or tool calls as OpenAI's `tool_calls` deltas."""

    def __init__(self, plan: ToolPlan) -> None:
        self.plan = plan
        self.parser = HermesStreamParser() if plan.mode == "auto" else None
        self.buffer = ""  # "required": the array, parsed at the end
        self.named_call: ToolCall | None = None
        self.calls: list[ToolCall] = []

    def feed(self, text: str) -> list[dict]:
        mode = self.plan.mode
        if mode == "auto":
            content, calls = self.parser.feed(text)
            return self._deltas(content, calls)
        if mode == "required":
            self.buffer += text
            return []
        if mode == "named":
            if not text:
                return []
            if self.named_call is None:
                self.named_call = ToolCall(self.plan.function_name, "")
                self.calls.append(self.named_call)
                head = self.named_call.to_openai(index=0)
                head["function"]["arguments"] = text
                return [{"tool_calls": [head]}]
            return [{"tool_calls": [{"index": 0, "function": {"arguments": text}}]}]
        return [{"content": text}] if text else []

    def finish(self) -> list[dict]:
        if self.plan.mode == "auto":
            content, calls = self.parser.finish()
            return self._deltas(content, calls)
        if self.plan.mode == "required":
            calls = parse_required(self.buffer)
            if not calls:
                return [{"content": self.buffer}] if self.buffer else []
            return self._deltas("", calls)
        return []

    def _deltas(self, content: str, calls: list[ToolCall]) -> list[dict]:
        out: list[dict] = [{"content": content}] if content else []
        if not self.plan.parallel:
            calls = calls[: max(0, 1 - len(self.calls))]
        for call in calls:
            out.append({"tool_calls": [call.to_openai(index=len(self.calls))]})
            self.calls.append(call)
        return out
