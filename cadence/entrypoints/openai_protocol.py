"""Pydantic models of the OpenAI-compatible API (requests validated at the door).

Unknown fields are accepted and ignored, as OpenAI clients send extras freely; values out
of range are 400s. Extensions (top_k, min_p, repetition_penalty, ignore_eos, min_tokens,
priority, ...) follow vLLM's names.

Structured outputs come three ways, all ending in one StructuredOutputsParams:
`response_format` (OpenAI: json_object / json_schema), `structured_outputs` (vLLM's object:
json | regex | choice | grammar | json_object) and vLLM's older `guided_json`,
`guided_regex`, `guided_choice`, `guided_grammar`. Giving more than one is a 400.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictInt, field_validator, model_validator

from cadence.entrypoints.tool_calls import ChatTool, ToolChoice
from cadence.sampling_params import SamplingParams, StructuredOutputsParams

MAX_STOP_STRINGS = 16
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


def random_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


class _Base(BaseModel):
    model_config = ConfigDict(extra="ignore")


class StreamOptions(_Base):
    include_usage: bool = False
    continuous_usage_stats: bool = False


class JsonSchemaFormat(_Base):
    name: str | None = None
    description: str | None = None
    # `schema` shadows a BaseModel attribute, hence the alias.
    json_schema: dict[str, Any] | bool | None = Field(default=None, alias="schema")
    strict: bool | None = None


class ResponseFormat(_Base):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None


class StructuredOutputsRequest(_Base):
    """vLLM's `structured_outputs` object; set exactly one of the first five."""

    json_: dict[str, Any] | str | bool | None = Field(default=None, alias="json")
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: bool | None = None
    # Whitespace between JSON tokens: none by default (see StructuredOutputsParams).
    any_whitespace: bool | None = None
    disable_any_whitespace: bool | None = None  # vLLM's name for the opposite
    max_whitespace: Annotated[int, Field(ge=0)] | None = None
    whitespace_pattern: str | None = None


class _SamplingFields(_Base):
    model: str | None = None
    max_tokens: Annotated[int, Field(ge=1)] | None = None
    temperature: Annotated[float, Field(ge=0.0, le=2.0)] | None = None
    top_p: Annotated[float, Field(gt=0.0, le=1.0)] | None = None
    top_k: Annotated[int, Field(ge=-1)] | None = None
    min_p: Annotated[float, Field(ge=0.0, le=1.0)] | None = None
    n: Annotated[int, Field(ge=1, le=64)] = 1
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    seed: Annotated[int, Field(ge=INT64_MIN, le=INT64_MAX)] | None = None
    presence_penalty: Annotated[float, Field(ge=-2.0, le=2.0)] | None = None
    frequency_penalty: Annotated[float, Field(ge=-2.0, le=2.0)] | None = None
    repetition_penalty: Annotated[float, Field(gt=0.0, le=10.0)] | None = None
    logit_bias: dict[str, Annotated[float, Field(ge=-100.0, le=100.0)]] | None = None
    ignore_eos: bool = False
    min_tokens: Annotated[int, Field(ge=0)] = 0
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    user: str | None = None
    # smaller runs first (--scheduling-policy priority); bounded like vLLM's int32 field
    priority: Annotated[int, Field(ge=-(2**31), le=2**31 - 1)] = 0
    stream: bool = False
    stream_options: StreamOptions | None = None
    response_format: ResponseFormat | None = None
    structured_outputs: StructuredOutputsRequest | None = None
    guided_json: dict[str, Any] | str | None = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None
    guided_whitespace_pattern: str | None = None
    # Disaggregated prefill/decode (vLLM's field; set by `cadence router --prefill ...`)
    kv_transfer_params: dict[str, Any] | None = None

    @model_validator(mode="after")
    def _stream_options_need_stream(self):
        if self.stream_options is not None and not self.stream:
            raise ValueError("stream_options is only allowed with stream: true")
        return self

    @field_validator("stop")
    @classmethod
    def _stop(cls, v):
        if isinstance(v, list):
            if len(v) > MAX_STOP_STRINGS:
                raise ValueError(f"at most {MAX_STOP_STRINGS} stop strings")
            if any(not s for s in v):
                raise ValueError("stop strings must not be empty")
        return v

    def to_sampling_params(
        self, max_tokens: int | None, logprobs: int | None, default_max: int
    ) -> SamplingParams:
        bias = None
        if self.logit_bias:
            try:
                bias = {int(k): float(v) for k, v in self.logit_bias.items()}
            except ValueError as e:
                raise ValueError("logit_bias keys must be token ids") from e
        return SamplingParams(
            n=self.n,
            temperature=1.0 if self.temperature is None else self.temperature,
            top_p=1.0 if self.top_p is None else self.top_p,
            top_k=self.top_k or 0,
            min_p=self.min_p or 0.0,
            presence_penalty=self.presence_penalty or 0.0,
            frequency_penalty=self.frequency_penalty or 0.0,
            repetition_penalty=self.repetition_penalty or 1.0,
            logit_bias=bias,
            seed=self.seed,
            max_tokens=default_max if max_tokens is None else max_tokens,
            min_tokens=self.min_tokens,
            stop=self.stop,
            stop_token_ids=self.stop_token_ids or [],
            include_stop_str_in_output=self.include_stop_str_in_output,
            ignore_eos=self.ignore_eos,
            logprobs=logprobs,
            skip_special_tokens=self.skip_special_tokens,
            structured_outputs=self.structured_params(),
            kv_transfer_params=self.kv_transfer_params,
        )

    def structured_params(self) -> StructuredOutputsParams | None:
        """The one output constraint this request asks for, if any (ValueError if many)."""
        found: list[tuple[str, StructuredOutputsParams]] = []
        rf = self.response_format
        if rf is not None and rf.type == "json_object":
            found.append(("response_format", StructuredOutputsParams(json_object=True)))
        elif rf is not None and rf.type == "json_schema":
            if rf.json_schema is None or rf.json_schema.json_schema is None:
                raise ValueError("response_format json_schema needs json_schema.schema")
            schema = rf.json_schema.json_schema
            strict = bool(rf.json_schema.strict)  # OpenAI's contract: all of it, or a 400
            found.append(("response_format", _schema_params(schema, strict)))
        so = self.structured_outputs
        if so is not None:
            kinds = {
                "json": so.json_ is not None,
                "regex": so.regex is not None,
                "choice": so.choice is not None,
                "grammar": so.grammar is not None,
                "json_object": bool(so.json_object),
            }
            if sum(kinds.values()) != 1:
                given = [k for k, v in kinds.items() if v]
                raise ValueError(
                    "structured_outputs takes exactly one of json, regex, choice, grammar, "
                    f"json_object; got {', '.join(given) or 'none'}"
                )
            if so.whitespace_pattern is not None:
                raise ValueError(
                    "structured_outputs.whitespace_pattern is not supported; use any_whitespace "
                    "and max_whitespace"
                )
            any_ws = bool(so.any_whitespace)
            if so.disable_any_whitespace is not None:
                any_ws = not so.disable_any_whitespace
            params = (
                _schema_params(so.json_)
                if so.json_ is not None
                else StructuredOutputsParams(
                    regex=so.regex,
                    choice=so.choice,
                    grammar=so.grammar,
                    json_object=bool(so.json_object),
                )
            )
            params.any_whitespace = any_ws
            params.max_whitespace = so.max_whitespace
            found.append(("structured_outputs", params))
        if self.guided_whitespace_pattern is not None:
            raise ValueError("guided_whitespace_pattern is not supported")
        for name, kwargs in (
            ("guided_json", None if self.guided_json is None else "json"),
            ("guided_regex", None if self.guided_regex is None else "regex"),
            ("guided_choice", None if self.guided_choice is None else "choice"),
            ("guided_grammar", None if self.guided_grammar is None else "grammar"),
        ):
            if kwargs is None:
                continue
            value = getattr(self, name)
            if kwargs == "json":
                found.append((name, _schema_params(value)))
            else:
                found.append((name, StructuredOutputsParams(**{kwargs: value})))
        if len(found) > 1:
            raise ValueError(
                "give one output constraint, not several: " + ", ".join(n for n, _ in found)
            )
        return found[0][1] if found else None


def _schema_params(
    schema: dict[str, Any] | str | bool, strict: bool = False
) -> StructuredOutputsParams:
    if schema is True:
        return StructuredOutputsParams(json=json.dumps(True))
    if schema is False:
        raise ValueError("the JSON schema `false` matches nothing")
    return StructuredOutputsParams(json=schema, strict=strict)


# Tried in this order, strictly (ids stay ids, strings strings): pydantic's default "smart"
# union costs ~0.7 us per id on a long id list (7.8 s for 10 M ids on the event loop);
# left to right, 35 ns.
PromptField = Annotated[
    str | list[StrictInt] | list[str] | list[list[StrictInt]], Field(union_mode="left_to_right")
]


class CompletionRequest(_SamplingFields):
    prompt: PromptField
    echo: bool = False
    logprobs: Annotated[int, Field(ge=0, le=20)] | None = None
    suffix: str | None = None
    best_of: Annotated[int, Field(ge=1, le=64)] | None = None  # >= n; not with stream

    @field_validator("prompt")
    @classmethod
    def _prompt(cls, v):
        if isinstance(v, list) and len(v) == 0:
            raise ValueError("prompt must not be empty")
        return v


class TextPart(_Base):
    type: Literal["text"]
    text: str


class ImageURL(_Base):
    url: str
    detail: Literal["auto", "low", "high"] | None = None  # accepted; the processor decides


class ImagePart(_Base):
    """An image for a vision-language model: a data: URL (base64 PNG, JPEG, WebP, GIF,
    BMP), or an http(s) URL of a domain the server allows (--allowed-media-domains)."""

    type: Literal["image_url"]
    image_url: ImageURL | str  # (some clients send the URL itself)

    @property
    def url(self) -> str:
        return self.image_url if isinstance(self.image_url, str) else self.image_url.url


ContentPart = Annotated[TextPart | ImagePart, Field(discriminator="type")]


class FunctionCallIn(_Base):
    name: str
    arguments: str | dict[str, Any] = "{}"


class ToolCallIn(_Base):
    """A tool call of an earlier assistant message, sent back in the conversation."""

    id: str | None = None
    type: Literal["function"] = "function"
    function: FunctionCallIn


class ChatMessage(_Base):
    role: Literal["system", "user", "assistant", "developer", "tool"]
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCallIn] | None = None
    tool_call_id: str | None = None

    def text(self) -> str:
        """Its text (image parts left out)."""
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(p.text for p in self.content if isinstance(p, TextPart))

    def image_urls(self) -> list[str]:
        if not isinstance(self.content, list):
            return []
        return [p.url for p in self.content if isinstance(p, ImagePart)]

    def template_content(self) -> str | list[dict]:
        """What the chat template renders: the text, or with images, the parts in order
        (an image as {"type": "image"}, which a vision-language template writes as its
        placeholder)."""
        if not self.image_urls():
            return self.text()
        return [
            {"type": "text", "text": p.text} if isinstance(p, TextPart) else {"type": "image"}
            for p in self.content
        ]


class ChatCompletionRequest(_SamplingFields):
    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    max_completion_tokens: Annotated[int, Field(ge=1)] | None = None
    logprobs: bool = False
    top_logprobs: Annotated[int, Field(ge=0, le=20)] | None = None
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    chat_template_kwargs: dict[str, Any] | None = None
    tools: list[ChatTool] | None = None
    tool_choice: ToolChoice | None = None
    parallel_tool_calls: bool = True
    # With --reasoning-parser: thinking longer than this is closed by force
    max_thinking_tokens: Annotated[int, Field(ge=0)] | None = None


MAX_EMBEDDING_INPUTS = 2048  # OpenAI's limit on one request's inputs


class EmbeddingRequest(_Base):
    model: str | None = None
    # text, texts, one prompt's token ids, or several prompts' (strictly, as PromptField)
    input: Annotated[
        str | list[StrictInt] | list[str] | list[list[StrictInt]], Field(union_mode="left_to_right")
    ]
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: Annotated[int, Field(ge=1)] | None = None
    user: str | None = None
    # vLLM's: keep a prompt's last k tokens (-1: the model's context length)
    truncate_prompt_tokens: Annotated[int, Field(ge=-1)] | None = None
    priority: Annotated[int, Field(ge=-(2**31), le=2**31 - 1)] = 0

    @field_validator("input")
    @classmethod
    def _input(cls, v):
        if isinstance(v, list) and not v:
            raise ValueError("input must not be empty")
        if isinstance(v, list) and len(v) > MAX_EMBEDDING_INPUTS and not isinstance(v[0], int):
            raise ValueError(f"at most {MAX_EMBEDDING_INPUTS} inputs per request")
        return v

    @field_validator("truncate_prompt_tokens")
    @classmethod
    def _truncate(cls, v):
        if v == 0:
            raise ValueError("truncate_prompt_tokens keeps the last k tokens: k >= 1, or -1")
        return v


class TokenizeRequest(_Base):
    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    add_special_tokens: bool = True
    add_generation_prompt: bool = True
    chat_template_kwargs: dict[str, Any] | None = None


class DetokenizeRequest(_Base):
    model: str | None = None
    tokens: list[int]


class UsageInfo(BaseModel):
    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0
    prompt_tokens_details: dict[str, int] | None = None


def now() -> int:
    return int(time.time())
