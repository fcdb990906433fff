"""What the endpoints share: checks, sampling parameters, admission, running a request in
the engine, usage. The endpoints themselves are serving_completion.py, serving_chat.py
(whose chat path /v1/responses and /v1/messages translate onto) and serving_embeddings.py;
text -> ids is prompts.py (off the event loop).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

from cadence.engine.client import AsyncEngineClient
from cadence.engine.output_processor import RequestState
from cadence.entrypoints.admission import Admission
from cadence.entrypoints.errors import APIError
from cadence.entrypoints.logprobs_format import LogprobsFormatter
from cadence.entrypoints.lora_adapters import LoRAAdapters
from cadence.entrypoints.openai_protocol import ChatCompletionRequest, UsageInfo
from cadence.entrypoints.prompts import PromptBuilder
from cadence.entrypoints.streaming import sse
from cadence.kv_transfer.params import TransferAuthority
from cadence.lora_request import LoRARequest
from cadence.multimodal.inputs import ImageInput
from cadence.sampling_params import SamplingParams
from cadence.structured.grammar import to_grammar

# Parsing a schema into a grammar at the door is quick for real schemas; a pathological one
# must not hold a worker thread (and the request) for long. The compile proper runs in the
# engine, bounded by --grammar-compile-timeout.
GRAMMAR_PARSE_TIMEOUT_S = 10.0


@dataclass
class Prompt:
    text: str | None
    token_ids: list[int]
    lora: LoRARequest | None = None  # the adapter the request named (None: the base model)
    images: list[ImageInput] = field(default_factory=list)  # behind its image placeholders


class Serving:
    """Shared by both endpoints: the client, the prompt builder, the served name, limits."""

    def __init__(
        self,
        client: AsyncEngineClient,
        prompts: PromptBuilder,
        served_model_name: str,
        max_model_len: int,
        admission: Admission,
        transfers: TransferAuthority,
        adapters: LoRAAdapters | None = None,
    ) -> None:
        """`adapters`: the LoRA adapters served by name (None: the base model only)."""
        self.client = client
        self.prompts = prompts
        self.tokenizer = prompts.tokenizer
        self.model_name = served_model_name
        self.max_model_len = max_model_len
        self.admission = admission
        self.transfers = transfers
        self.adapters = adapters
        self.logprobs = LogprobsFormatter(self.tokenizer)

    # ---- checks -----------------------------------------------------------------------

    def check_model(self, model: str | None) -> LoRARequest | None:
        """The adapter `model` names (None: the base model); a 404 for an unknown name."""
        if self.adapters is not None:
            return self.adapters.resolve(model)
        if model is not None and model != self.model_name:
            raise APIError(
                f"The model `{model}` does not exist. Serving: `{self.model_name}`.",
                404,
                "NotFoundError",
                "model",
                "model_not_found",
            )
        return None

    def served_name(self, prompt: Prompt) -> str:
        """What a response's `model` says: the adapter the request named, or the base."""
        return prompt.lora.lora_name if prompt.lora is not None else self.model_name

    def check_transfer(self, req, num_prompts: int = 1) -> None:
        """A request's kv_transfer_params is the router's, signed (kv_transfer/params.py):
        a client's own is a 403, before any other work. One prompt per transfer."""
        if req.kv_transfer_params is None:
            return
        if num_prompts != 1:
            raise APIError("kv_transfer_params takes one prompt", param="kv_transfer_params")
        try:
            req.kv_transfer_params = self.transfers.verify(req.kv_transfer_params)
        except PermissionError as e:
            raise APIError(
                str(e), 403, "permission_error", "kv_transfer_params", "kv_transfer_forbidden"
            ) from None
        except ValueError as e:
            raise APIError(str(e), param="kv_transfer_params") from None

    def sampling_params(
        self, req, max_tokens: int | None, logprobs: int | None, prompt_len: int
    ) -> SamplingParams:
        if self.client.ready.pooling is not None:
            raise APIError(
                f"`{self.model_name}` is an embedding model (--runner pooling): it serves "
                "/v1/embeddings only",
                param="model",
                code="model_not_generative",
            )
        room = self.max_model_len - prompt_len
        if room < 1:
            raise APIError(
                f"This model's maximum context length is {self.max_model_len} tokens. However, your "
                f"prompt has {prompt_len} tokens, leaving no room for a completion.",
                param="messages" if isinstance(req, ChatCompletionRequest) else "prompt",
                code="context_length_exceeded",
            )
        if max_tokens is not None and max_tokens > room:
            raise APIError(
                f"This model's maximum context length is {self.max_model_len} tokens. However, you "
                f"requested {prompt_len + max_tokens} tokens ({prompt_len} in the prompt, {max_tokens} "
                "for the completion). Please reduce the prompt or max_tokens.",
                param="max_tokens",
                code="context_length_exceeded",
            )
        try:
            params = req.to_sampling_params(max_tokens, logprobs, room)
            params.verify(self.client.ready.vocab_size)
        except ValueError as e:
            raise APIError(str(e)) from e
        return params

    def check_ids(self, ids: list[int], param: str = "prompt") -> None:
        """The length first (one comparison), then each id: a client's list of a few
        million ids costs nothing past the first check."""
        if len(ids) > self.max_model_len:
            raise APIError(
                f"This model's maximum context length is {self.max_model_len} tokens. However, "
                f"your {param} has {len(ids)} tokens.",
                param=param,
                code="context_length_exceeded",
            )
        vocab = self.client.ready.vocab_size
        if ids and not (min(ids) >= 0 and max(ids) < vocab):
            bad = next(t for t in ids if not 0 <= t < vocab)
            raise APIError(f"token id {bad} is outside the vocabulary [0, {vocab})", param=param)

    async def check_structured(self, params: SamplingParams, param: str | None = None) -> None:
        """Parse the request's grammar here (off the event loop) so a bad schema, regex or
        EBNF is a 400 before anything is queued."""
        so = params.structured_outputs
        if so is None:
            return
        # On the prompt pool (bounded threads), not asyncio's default executor: a schema
        # whose parse blows up holds one of a few threads, never an unbounded number.
        loop = asyncio.get_running_loop()
        try:
            await asyncio.wait_for(
                loop.run_in_executor(self.prompts.pool, to_grammar, so), GRAMMAR_PARSE_TIMEOUT_S
            )
        except TimeoutError:
            raise APIError(
                f"the output constraint took over {GRAMMAR_PARSE_TIMEOUT_S:g} s to parse; "
                "simplify the schema",
                param=param or "response_format",
                code="grammar_timeout",
            ) from None
        except ValueError as e:
            raise APIError(str(e), param=param or "response_format") from e

    # ---- running ----------------------------------------------------------------------

    async def run(
        self,
        rid: str,
        prompt: Prompt,
        params: SamplingParams,
        priority: int,
        started: Callable[[], None],
    ) -> AsyncIterator[RequestState]:
        """The request's states as tokens arrive; `started()` once its first token came
        (the admission ticket's prompt tokens are no longer queued)."""
        async for state in self.client.generate(
            rid, prompt.text, prompt.token_ids, params, priority, prompt.lora, prompt.images
        ):
            started()
            yield state

    async def final(
        self,
        rid: str,
        prompt: Prompt,
        params: SamplingParams,
        priority: int,
        started: Callable[[], None],
    ) -> RequestState:
        final = None
        async for state in self.run(rid, prompt, params, priority, started):
            final = state
        return final

    # ---- output -----------------------------------------------------------------------

    def usage(self, prompts: list[Prompt], states: list[RequestState | None]) -> dict:
        """Usage of a request so far: prompt tokens (and how many came from the prefix
        cache), completion tokens of every sample."""
        prompt_tokens = sum(len(p.token_ids) for p in prompts)
        completion = sum(
            len(s.output.token_ids) for st in states if st is not None for s in st.samples
        )
        cached = sum(st.num_cached_tokens for st in states if st is not None)
        return UsageInfo(
            prompt_tokens=prompt_tokens,
            completion_tokens=completion,
            total_tokens=prompt_tokens + completion,
            prompt_tokens_details={"cached_tokens": cached},
        ).model_dump(exclude_none=True)

    def chunk(
        self,
        rid: str,
        obj: str,
        created: int,
        choices: list,
        usage: dict | None,
        model: str | None = None,
    ) -> str:
        """One SSE event of a stream (`model`: the name it answers as; None: the base)."""
        body = {
            "id": rid,
            "object": obj,
            "created": created,
            "model": model or self.model_name,
            "choices": choices,
        }
        if usage is not None:
            body["usage"] = usage
        return sse(body)


def finish_reason(reason: str | None) -> str | None:
    """OpenAI's finish reasons: length, stop; abort and error are vLLM's (a request cut off;
    an output that breaks its JSON schema where the grammar reached a dead end)."""
    if reason is None or reason in ("length", "abort", "error"):
        return reason
    return "stop"


def raise_if_aborted(reason: str | None) -> None:
    """The translated APIs (Responses, Messages) have no finish reason for a request the
    server cut off (a drain): they answer 503, which their clients retry elsewhere; nor
    for an output that broke its schema (finish reason "error"): a 500 saying so."""
    if reason == "abort":
        raise APIError(
            "the server stopped this request (shutting down)", 503, "service_unavailable"
        )
    if reason == "error":
        raise APIError(
            "the model's output broke the JSON schema where the grammar could not steer it "
            "(a run-time schema check found no valid way on); retry, or simplify the schema",
            500,
            "server_error",
        )
