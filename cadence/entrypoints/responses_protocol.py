"""The OpenAI Responses API's request, and its translation into the chat path's request.

A Responses request becomes a ChatCompletionRequest (the one internal form the
conversational APIs share): `instructions` the system message, `input` items the messages
(function calls an assistant's tool_calls, their outputs tool messages), `text.format` the
response_format, function tools chat tools, `max_output_tokens` max_completion_tokens,
`input_image` parts image_url parts (for a vision-language model). Fields that steer what
we cannot do (hosted tools, files, audio) are 400s, not silently dropped.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from cadence.entrypoints.openai_protocol import (
    INT64_MAX,
    INT64_MIN,
    ChatCompletionRequest,
    ChatMessage,
)

RESPONSE_ID = re.compile(r"resp_[0-9a-f]{32}")
LOGPROBS_INCLUDE = "message.output_text.logprobs"


class _Base(BaseModel):
    model_config = ConfigDict(extra="ignore")


class FunctionTool(_Base):
    type: str = "function"
    name: str | None = None
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class NamedFunctionChoice(_Base):
    type: str
    name: str | None = None


class TextFormat(_Base):
    type: Literal["text", "json_object", "json_schema"] = "text"
    name: str | None = None
    description: str | None = None
    json_schema: dict[str, Any] | bool | None = Field(default=None, alias="schema")
    strict: bool | None = None


class TextConfig(_Base):
    format: TextFormat | None = None
    verbosity: str | None = None


class ResponsesRequest(_Base):
    model: str | None = None
    input: str | list[dict[str, Any]]
    instructions: str | None = None
    max_output_tokens: Annotated[int, Field(ge=1)] | None = None
    temperature: Annotated[float, Field(ge=0.0, le=2.0)] | None = None
    top_p: Annotated[float, Field(gt=0.0, le=1.0)] | None = None
    top_logprobs: Annotated[int, Field(ge=0, le=20)] | None = None
    include: list[str] | None = None
    tools: list[FunctionTool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedFunctionChoice | None = None
    parallel_tool_calls: bool = True
    text: TextConfig | None = None
    stream: bool = False
    store: bool | None = None
    previous_response_id: str | None = None
    reasoning: dict[str, Any] | None = None
    metadata: dict[str, str] | None = None
    truncation: Literal["auto", "disabled"] | None = None
    user: str | None = None
    # vLLM's sampling extensions, as on chat
    top_k: Annotated[int, Field(ge=-1)] | None = None
    min_p: Annotated[float, Field(ge=0.0, le=1.0)] | None = None
    repetition_penalty: Annotated[float, Field(gt=0.0, le=10.0)] | None = None
    presence_penalty: Annotated[float, Field(ge=-2.0, le=2.0)] | None = None
    frequency_penalty: Annotated[float, Field(ge=-2.0, le=2.0)] | None = None
    seed: Annotated[int, Field(ge=INT64_MIN, le=INT64_MAX)] | None = None
    ignore_eos: bool = False
    priority: Annotated[int, Field(ge=-(2**31), le=2**31 - 1)] = 0

    @property
    def wants_logprobs(self) -> bool:
        return self.top_logprobs is not None or LOGPROBS_INCLUDE in (self.include or [])


def input_messages(items: str | list[dict[str, Any]]) -> list[dict[str, Any]]:
    """`input` as chat messages (dicts of ChatMessage's fields). Raises ValueError."""
    if isinstance(items, str):
        return [{"role": "user", "content": items}]
    out: list[dict[str, Any]] = []
    for i, item in enumerate(items):
        if not isinstance(item, dict):
            raise ValueError(f"input[{i}] must be an object")
        kind = item.get("type", "message")
        if kind == "message":
            role = item.get("role")
            if role not in ("user", "assistant", "system", "developer"):
                raise ValueError(f"input[{i}].role must be user, assistant, system or developer")
            out.append({"role": role, "content": _content_of(item.get("content"), f"input[{i}]")})
        elif kind == "function_call":
            call = {
                "id": _string(item, "call_id", i),
                "type": "function",
                "function": {
                    "name": _string(item, "name", i),
                    "arguments": item.get("arguments") or "{}",
                },
            }
            last = out[-1] if out else None
            if last is not None and last["role"] == "assistant":
                last.setdefault("tool_calls", []).append(call)
            else:
                out.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            output = item.get("output")
            text = output if isinstance(output, str) else _text_of(output, f"input[{i}].output")
            out.append(
                {"role": "tool", "tool_call_id": _string(item, "call_id", i), "content": text}
            )
        elif kind == "reasoning":
            continue  # earlier thinking is not shown to the model again
        elif kind == "item_reference":
            raise ValueError(f"input[{i}]: item_reference needs stored items; send the item itself")
        else:
            raise ValueError(f"input[{i}]: items of type {kind!r} are not supported")
    return out


def _string(item: dict, key: str, i: int) -> str:
    value = item.get(key)
    if not isinstance(value, str) or not value:
        raise ValueError(f"input[{i}].{key} must be a non-empty string")
    return value


def _content_of(content: Any, where: str) -> str | list[dict[str, Any]]:
    """A message's content as chat content: its text, or with input_image parts, chat
    parts in order (an image as an image_url part: a data: or http(s) URL)."""
    if not isinstance(content, list) or not any(
        isinstance(p, dict) and p.get("type") == "input_image" for p in content
    ):
        return _text_of(content, where)
    parts = []
    for j, part in enumerate(content):
        if isinstance(part, dict) and part.get("type") == "input_image":
            url = part.get("image_url")
            if not isinstance(url, str) or not url:
                raise ValueError(f"{where}.content[{j}]: input_image needs an image_url")
            parts.append({"type": "image_url", "image_url": {"url": url}})
        else:
            parts.append({"type": "text", "text": _text_of([part], where)})
    return parts


def _text_of(content: Any, where: str) -> str:
    """A message's content (text, or a list of text parts) as one string."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise ValueError(f"{where}.content must be a string or a list of parts")
    texts = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in ("input_text", "output_text", "text", "summary_text", "reasoning_text"):
            texts.append(str(part.get("text", "")))
        elif kind == "refusal":
            texts.append(str(part.get("refusal", "")))
        elif kind in ("input_image", "input_file", "input_audio"):  # (images: _content_of)
            raise ValueError(f"{where}.content[{j}]: {kind} is not supported by this server")
        else:
            raise ValueError(f"{where}.content[{j}]: unknown part type {kind!r}")
    return "".join(texts)


def to_chat(req: ResponsesRequest, history: list[dict[str, Any]]) -> ChatCompletionRequest:
    """The chat request that runs `req` after the stored conversation `history`."""
    messages: list[dict[str, Any]] = []
    if req.instructions:
        messages.append({"role": "system", "content": req.instructions})
    messages += history + input_messages(req.input)
    if not messages:
        raise ValueError("input is empty")
    tools = None
    if req.tools:
        tools = []
        for t in req.tools:
            if t.type != "function":
                raise ValueError(f"tools of type {t.type!r} are not supported: function tools only")
            if not t.name:
                raise ValueError("a function tool needs a name")
            fn = {"name": t.name, "description": t.description, "parameters": t.parameters}
            tools.append({"type": "function", "function": fn})
    choice: Any = req.tool_choice
    if isinstance(choice, NamedFunctionChoice):
        if choice.type != "function" or not choice.name:
            raise ValueError('tool_choice names a function: {"type": "function", "name": ...}')
        choice = {"type": "function", "function": {"name": choice.name}}
    fmt = req.text.format if req.text is not None else None
    response_format = None
    if fmt is not None and fmt.type == "json_object":
        response_format = {"type": "json_object"}
    elif fmt is not None and fmt.type == "json_schema":
        if fmt.json_schema is None:
            raise ValueError("text.format json_schema needs a schema")
        response_format = {
            "type": "json_schema",
            "json_schema": {"name": fmt.name, "schema": fmt.json_schema, "strict": fmt.strict},
        }
    effort = (req.reasoning or {}).get("effort")
    fields = {
        "model": req.model,
        # (gpt-oss's template reads reasoning_effort; Qwen3's, enable_thinking)
        "chat_template_kwargs": None
        if effort is None
        else {"reasoning_effort": effort, "enable_thinking": effort not in ("none", "minimal")},
        "messages": [ChatMessage.model_validate(m) for m in messages],
        "max_completion_tokens": req.max_output_tokens,
        "tools": tools,
        "tool_choice": choice,
        "parallel_tool_calls": req.parallel_tool_calls,
        "response_format": response_format,
        "logprobs": req.wants_logprobs,
        "top_logprobs": req.top_logprobs if req.wants_logprobs else None,
    }
    for name in (
        "temperature", "top_p", "top_k", "min_p", "repetition_penalty", "presence_penalty",
        "frequency_penalty", "seed", "ignore_eos", "priority", "user",
    ):  # fmt: skip
        fields[name] = getattr(req, name)
    return ChatCompletionRequest.model_validate(fields)
