"""The Anthropic Messages API's request, and its translation into the chat path's request.

`system` becomes the system message; a user turn's `tool_result` blocks become tool
messages (before the turn's text), an assistant turn's `tool_use` blocks its tool_calls;
tools' `input_schema` the functions' parameters; tool_choice auto / any / tool / none the
chat's auto / required / named / none (`disable_parallel_tool_use`: one call at most);
`stop_sequences` the stop strings; `output_config.format` (a JSON schema) the
response_format; an assistant turn last (a prefill) is continued, not answered. A user
turn's image blocks (base64 or url sources) become image_url parts; documents are 400s.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from cadence.entrypoints.openai_protocol import MAX_STOP_STRINGS, ChatCompletionRequest


class _Base(BaseModel):
    model_config = ConfigDict(extra="ignore")


class AnthropicTool(_Base):
    name: str
    description: str | None = None
    input_schema: dict[str, Any] | None = None
    type: str | None = None  # "custom" or absent; server tools (web_search_...) are refused


class AnthropicToolChoice(_Base):
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool = False


class AnthropicMessage(_Base):
    role: Literal["user", "assistant"]
    content: str | list[dict[str, Any]]


class OutputFormat(_Base):
    type: Literal["json_schema"]
    json_schema: dict[str, Any] = Field(alias="schema")


class OutputConfig(_Base):
    format: OutputFormat | None = None


class MessagesRequest(_Base):
    model: str
    max_tokens: Annotated[int, Field(ge=1)]
    messages: Annotated[list[AnthropicMessage], Field(min_length=1)]
    system: str | list[dict[str, Any]] | None = None
    stop_sequences: Annotated[list[str], Field(max_length=MAX_STOP_STRINGS)] | None = None
    stream: bool = False
    temperature: Annotated[float, Field(ge=0.0, le=1.0)] | None = None
    top_p: Annotated[float, Field(gt=0.0, le=1.0)] | None = None
    top_k: Annotated[int, Field(ge=0)] | None = None
    tools: list[AnthropicTool] | None = None
    tool_choice: AnthropicToolChoice | None = None
    metadata: dict[str, Any] | None = None
    output_config: OutputConfig | None = None
    thinking: dict[str, Any] | None = None
    service_tier: str | None = None


class CountTokensRequest(MessagesRequest):
    """POST /v1/messages/count_tokens: a Messages request without max_tokens."""

    max_tokens: Annotated[int, Field(ge=1)] = 1


def _blocks(content: str | list[dict[str, Any]], where: str) -> list[dict[str, Any]]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    for j, block in enumerate(content):
        if not isinstance(block, dict) or not isinstance(block.get("type"), str):
            raise ValueError(f"{where}.content[{j}] must be a content block with a type")
    return content


def _text(blocks: list[dict[str, Any]], where: str) -> str:
    """The text of text blocks (tool results may be text or text blocks)."""
    out = []
    for j, b in enumerate(blocks):
        if b.get("type") != "text":
            raise ValueError(f"{where}[{j}]: {b.get('type')} blocks are not supported here")
        out.append(str(b.get("text", "")))
    return "".join(out)


def system_text(system: str | list[dict[str, Any]] | None) -> str:
    if system is None or isinstance(system, str):
        return system or ""
    return _text(system, "system")


def chat_messages(messages: list[AnthropicMessage]) -> list[dict[str, Any]]:
    """The conversation as chat messages (dicts of ChatMessage's fields). Raises ValueError."""
    out: list[dict[str, Any]] = []
    for i, m in enumerate(messages):
        where = f"messages[{i}]"
        texts: list[str] = []
        parts: list[dict[str, Any]] = []  # text and images in order, where there are images
        calls: list[dict[str, Any]] = []
        results: list[dict[str, Any]] = []
        for j, b in enumerate(_blocks(m.content, where)):
            kind = b["type"]
            if kind == "text":
                texts.append(str(b.get("text", "")))
                parts.append({"type": "text", "text": texts[-1]})
            elif kind == "image" and m.role == "user":
                parts.append(_image_part(b.get("source"), f"{where}.content[{j}]"))
            elif kind == "tool_use" and m.role == "assistant":
                if not isinstance(b.get("id"), str) or not isinstance(b.get("name"), str):
                    raise ValueError(f"{where}.content[{j}]: tool_use needs an id and a name")
                args = json.dumps(b.get("input") or {}, ensure_ascii=False)
                fn = {"name": b["name"], "arguments": args}
                calls.append({"id": b["id"], "type": "function", "function": fn})
            elif kind == "tool_result" and m.role == "user":
                if not isinstance(b.get("tool_use_id"), str):
                    raise ValueError(f"{where}.content[{j}]: tool_result needs a tool_use_id")
                content = b.get("content") or ""
                if not isinstance(content, str):
                    content = _text(content, f"{where}.content[{j}].content")
                text = f"Error: {content}" if b.get("is_error") else content
                results.append({"role": "tool", "tool_call_id": b["tool_use_id"], "content": text})
            elif kind in ("thinking", "redacted_thinking"):
                continue  # earlier thinking is not shown to the model again
            else:
                raise ValueError(
                    f"{where}.content[{j}]: {kind} blocks are not supported in a {m.role} message"
                )
        out += results
        if m.role == "assistant":
            msg: dict[str, Any] = {"role": "assistant", "content": "".join(texts) or None}
            if calls:
                msg["tool_calls"] = calls
            out.append(msg)
        elif len(parts) > len(texts):  # (images among them)
            out.append({"role": "user", "content": parts})
        elif texts or not results:
            out.append({"role": "user", "content": "".join(texts)})
    return out


def _image_part(source: Any, where: str) -> dict[str, Any]:
    """An Anthropic image block's source as an OpenAI image_url part: base64 data becomes a
    data: URL, a url stays one (the server's media policy decides whether it is fetched)."""
    kind = source.get("type") if isinstance(source, dict) else None
    if kind == "base64" and isinstance(source.get("data"), str):
        media = source.get("media_type") or "image/png"
        url = f"data:{media};base64,{source['data']}"
    elif kind == "url" and isinstance(source.get("url"), str):
        url = source["url"]
    else:
        raise ValueError(f"{where}: an image source is base64 data or a url")
    return {"type": "image_url", "image_url": {"url": url}}


def to_chat(req: MessagesRequest) -> ChatCompletionRequest:
    messages = chat_messages(req.messages)
    system = system_text(req.system)
    if system:
        messages.insert(0, {"role": "system", "content": system})
    tools = None
    if req.tools:
        tools = []
        for t in req.tools:
            if t.type not in (None, "custom"):
                raise ValueError(f"tools of type {t.type!r} are not supported: custom tools only")
            fn = {"name": t.name, "description": t.description, "parameters": t.input_schema}
            tools.append({"type": "function", "function": fn})
    choice: Any = None
    parallel = True
    tc = req.tool_choice
    if tc is not None:
        parallel = not tc.disable_parallel_tool_use
        if tc.type == "tool":
            if not tc.name:
                raise ValueError('tool_choice {"type": "tool"} needs the tool\'s name')
            choice = {"type": "function", "function": {"name": tc.name}}
        else:
            choice = {"auto": "auto", "any": "required", "none": "none"}[tc.type]
    response_format = None
    fmt = req.output_config.format if req.output_config is not None else None
    if fmt is not None:
        response_format = {"type": "json_schema", "json_schema": {"schema": fmt.json_schema}}
    # An assistant turn last is a prefill: the answer continues its text.
    last = messages[-1]
    prefill = last["role"] == "assistant" and not last.get("tool_calls") and bool(last["content"])
    kwargs, budget = None, None
    if req.thinking is not None and req.thinking.get("type") in ("enabled", "disabled"):
        kwargs = {"enable_thinking": req.thinking["type"] == "enabled"}  # (Qwen3's switch)
        if isinstance(req.thinking.get("budget_tokens"), int) and kwargs["enable_thinking"]:
            budget = max(0, req.thinking["budget_tokens"])  # kept where the server can
    return ChatCompletionRequest.model_validate(
        {
            "model": req.model,
            "chat_template_kwargs": kwargs,
            "messages": messages,
            "add_generation_prompt": not prefill,
            "continue_final_message": prefill,
            "max_tokens": req.max_tokens,
            "stop": req.stop_sequences or None,
            "temperature": req.temperature,
            "top_p": req.top_p,
            "top_k": req.top_k,
            "tools": tools,
            "tool_choice": choice,
            "parallel_tool_calls": parallel,
            "response_format": response_format,
            "max_thinking_tokens": budget,
        }
    )
