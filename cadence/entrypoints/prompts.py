"""Text to token ids, off the event loop: chat templates and tokenizing.

    builder = PromptBuilder(tokenizer, max_model_len)
    ids = await builder.encode(text)                      /v1/completions, /tokenize
    ids = await builder.chat(messages, ..., kwargs=...)   /v1/chat/completions, /tokenize

Rendering a template and tokenizing are CPU work whose cost the client controls (long
messages, long prompts), so they run on thread pools of their own, each within
`timeout_s` (past it: 408); the event loop keeps answering everyone else and /health. A
chat is rendered to text first (a conversation with more messages than the context has
tokens, or more characters than it can hold, is a 400 before rendering), then tokenized
like a prompt: tokenizing.py bounds what that costs.

`chat_template_kwargs` are template *variables* only. Names that would change what code
runs or how the call behaves (`chat_template`, `tokenize`, `return_tensors`, ..., and the
variables the server itself sets: `messages`, `tools`, `add_generation_prompt`, the
special tokens) are a 400. Other names reach the template only if the model's template
reads them (found by parsing it once); the rest are dropped, as a template would ignore
them anyway (so `enable_thinking` sent to a model without thinking is harmless).
"""

from __future__ import annotations

import asyncio
import logging
import os
from concurrent.futures import ThreadPoolExecutor

from cadence.entrypoints.errors import APIError
from cadence.entrypoints.tokenizing import TokenizerLanes
from cadence.entrypoints.tool_calls import (
    conversation_for_template,
    render_without_template_support,
    template_supports_tools,
    tools_for_template,
)
from cadence.multimodal.chat import ImageReader
from cadence.multimodal.inputs import ImageInput
from cadence.multimodal.media import MediaError

logger = logging.getLogger("cadence.api")

RENDER_TIMEOUT_S = 10.0

# apply_chat_template's own parameters and the variables the server sets: never a client's.
RESERVED_TEMPLATE_KWARGS = frozenset(
    {
        "chat_template",
        "tokenize",
        "padding",
        "truncation",
        "max_length",
        "return_tensors",
        "return_dict",
        "return_assistant_tokens_mask",
        "tokenizer_kwargs",
        "sanitize_control_tokens",
        "conversation",
        "messages",
        "tools",
        "add_generation_prompt",
        "continue_final_message",
        "raise_exception",
        "strftime_now",
        "bos_token",
        "eos_token",
        "unk_token",
        "pad_token",
        "sep_token",
        "cls_token",
        "mask_token",
        "additional_special_tokens",
    }
)


def template_variables(tokenizer) -> frozenset[str]:
    """The undeclared variables of the tokenizer's chat template(s): what a template reads
    from its caller."""
    template = getattr(tokenizer, "chat_template", None)
    if not template:
        return frozenset()
    sources = template.values() if isinstance(template, dict) else [template]
    import jinja2
    from jinja2 import meta
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    env = ImmutableSandboxedEnvironment(extensions=["jinja2.ext.loopcontrols"])
    names: set[str] = set()
    for src in sources:
        try:
            names |= meta.find_undeclared_variables(env.parse(src))
        except jinja2.TemplateError:
            logger.warning("cannot parse the chat template to list its variables")
    return frozenset(names)


class PromptBuilder:
    def __init__(
        self,
        tokenizer,
        max_model_len: int,
        timeout_s: float = RENDER_TIMEOUT_S,
        threads: int = 0,
        images: ImageReader | None = None,
    ) -> None:
        """`images`: a vision-language model's processor and media policy (None: a chat
        with image parts is a 400)."""
        self.tokenizer = tokenizer
        self.images = images
        self.timeout_s = timeout_s
        self.template_vars = template_variables(tokenizer) if tokenizer is not None else set()
        self.pool = ThreadPoolExecutor(
            threads or min(4, os.cpu_count() or 1), thread_name_prefix="cadence-prompt"
        )
        self.lanes = (
            TokenizerLanes(tokenizer, max_model_len, timeout_s, self.pool)
            if tokenizer is not None
            else None
        )
        self.max_model_len = max_model_len

    def shutdown(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)
        if self.lanes is not None:
            self.lanes.shutdown()

    async def _off_loop(self, what: str, fn, *args):
        loop = asyncio.get_running_loop()
        try:
            return await asyncio.wait_for(
                loop.run_in_executor(self.pool, fn, *args), self.timeout_s
            )
        except TimeoutError:
            raise APIError(
                f"{what} took longer than {self.timeout_s:g} s; send a shorter prompt",
                408,
                "timeout_error",
                code="request_timeout",
            ) from None

    # ---- completions ------------------------------------------------------------------

    async def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        if self.lanes is None:
            raise APIError("this model has no tokenizer: send token ids")
        ids = await self.lanes.encode(text, add_special_tokens)
        if not ids:
            raise APIError("prompt must not be empty", param="prompt")
        return ids

    async def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        if self.tokenizer is None:
            return ""
        return await self._off_loop(
            "detokenizing",
            lambda: self.tokenizer.decode(ids, skip_special_tokens=skip_special_tokens),
        )

    # ---- chat -------------------------------------------------------------------------

    def template_kwargs(self, kwargs: dict | None) -> dict:
        """The client's chat_template_kwargs that may reach the template (see the module
        docstring); a reserved name is a 400."""
        out = {}
        for name, value in (kwargs or {}).items():
            if name in RESERVED_TEMPLATE_KWARGS:
                raise APIError(
                    f"chat_template_kwargs may not set {name!r}: only the chat template's own "
                    "variables are accepted (a custom template or tokenizer options are not)",
                    param="chat_template_kwargs",
                )
            if name in self.template_vars:
                out[name] = value
        return out

    async def chat(
        self,
        messages,
        add_generation_prompt: bool = True,
        continue_final: bool = False,
        kwargs: dict | None = None,
        tools: list | None = None,
    ) -> tuple[list[int], list[ImageInput]]:
        """Token ids of the conversation through the chat template, and its images (each
        behind its placeholder tokens, in order); `tools` (ChatTool list) go to a template
        that knows tools, or into the system message of one that does not."""
        if self.tokenizer is None or not getattr(self.tokenizer, "chat_template", None):
            raise APIError("this model has no chat template; use /v1/completions")
        variables = self.template_kwargs(kwargs)
        if len(messages) > self.max_model_len:
            raise APIError(
                f"{len(messages)} messages: more than this model's context of "
                f"{self.max_model_len} tokens can hold",
                param="messages",
                code="context_length_exceeded",
            )
        self.lanes.check_chars(sum(len(m.text() or "") for m in messages), "messages")
        image_urls = [url for m in messages for url in m.image_urls()]
        if image_urls and self.images is None:
            raise APIError("this model does not take images", param="messages")
        if image_urls and len(image_urls) > self.images.limit:
            raise APIError(
                f"{len(image_urls)} images: at most {self.images.limit} per request "
                "(--limit-mm-per-prompt)",
                param="messages",
                code="too_many_images",
            )
        conv = []
        for m in messages:
            entry = {"role": m.role, "content": m.template_content()}
            if m.name:
                entry["name"] = m.name
            if m.tool_calls:
                entry["tool_calls"] = [c.model_dump() for c in m.tool_calls]
            if m.tool_call_id:
                entry["tool_call_id"] = m.tool_call_id
            conv.append(entry)
        uses_tools = bool(tools) or any(m.role == "tool" or m.tool_calls for m in messages)
        if uses_tools and template_supports_tools(self.tokenizer):
            conv = conversation_for_template(conv)
            if tools:
                variables["tools"] = tools_for_template(tools)
        elif uses_tools:
            conv = render_without_template_support(conv, tools)
        text = await self._off_loop(
            "applying the chat template",
            self._render,
            conv,
            add_generation_prompt and not continue_final,
            continue_final,
            variables,
        )
        if image_urls:
            return await self._off_loop("reading the images", self._read_images, text, image_urls)
        # (what apply_chat_template(tokenize=True) does: the text, without added specials)
        return await self.lanes.encode(text, add_special_tokens=False, param="messages"), []

    def _read_images(self, text: str, urls: list[str]) -> tuple[list[int], list[ImageInput]]:
        try:
            ids, images = self.images.read(text, urls)
        except MediaError as e:
            raise APIError(str(e), param="messages", code="invalid_image") from None
        return ids, images

    def _render(self, conv, add_generation_prompt, continue_final, variables) -> str:
        try:
            return self.tokenizer.apply_chat_template(
                conv,
                add_generation_prompt=add_generation_prompt,
                continue_final_message=continue_final,
                tokenize=False,
                **variables,
            )
        except Exception as e:  # a template may raise on a role order it does not allow
            raise APIError(f"cannot apply the chat template: {e}", param="messages") from e
