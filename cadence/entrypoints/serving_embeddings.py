"""/v1/embeddings: text or token ids to vectors, on an embedding model (--runner pooling).

Each input runs in the engine as a prompt with one greedy token (cadence/embeddings.py);
its pooled vector comes back with that token and is cut (`dimensions`, Matryoshka models)
and normalized here. A request's inputs are admitted together (their tokens count
against --max-queued-prompt-tokens) but hold at most a window of sequences at a time, so
one request of a couple of thousand inputs neither hogs the queue nor is refused for
its number of inputs.
"""

from __future__ import annotations

import asyncio
import base64

from cadence.embeddings import check_dimensions, embedding_params, finish_embedding
from cadence.entrypoints.errors import APIError
from cadence.entrypoints.openai_protocol import EmbeddingRequest, random_id
from cadence.entrypoints.serving import Prompt, Serving, raise_if_aborted


class EmbeddingServing(Serving):
    async def embed(self, req: EmbeddingRequest) -> dict:
        lora = self.check_model(req.model)
        spec = self.client.ready.pooling
        if spec is None:
            raise APIError(
                f"`{self.model_name}` is served for generation, not embeddings; serve an "
                "embedding model (or this one with --runner pooling)",
                param="model",
                code="model_not_embedding",
            )
        try:
            check_dimensions(spec, req.dimensions)
        except ValueError as e:
            raise APIError(str(e), param="dimensions") from None
        prompts = await self._prompts(req)
        for prompt in prompts:
            prompt.lora = lora
        lengths = [len(p.token_ids) for p in prompts]
        window = max(1, min(len(prompts), self.admission.max_seqs_in_flight // 2))
        rid = random_id("embd")
        gate = asyncio.Semaphore(window)
        with self.admission.admit(window, lengths) as ticket:

            async def one(i: int, prompt: Prompt) -> bytes:
                async with gate:
                    state = await self.final(
                        f"{rid}-{i}",
                        prompt,
                        embedding_params(),
                        req.priority,
                        lambda: ticket.started(i),
                    )
                out = state.samples[0].output
                raise_if_aborted(out.finish_reason)
                if state.embedding is None:
                    raise APIError(
                        f"input[{i}] came back without its vector", 500, "internal_error"
                    )
                return state.embedding

            # A task group: the first failure cancels (and so aborts) the others before the
            # admission is released.
            try:
                async with asyncio.TaskGroup() as group:
                    tasks = [group.create_task(one(i, p)) for i, p in enumerate(prompts)]
            except ExceptionGroup as failed:
                raise failed.exceptions[0] from None
            raws = [t.result() for t in tasks]
        data = []
        for i, raw in enumerate(raws):
            vec = finish_embedding(raw, spec, req.dimensions)
            if req.encoding_format == "base64":
                value: object = base64.b64encode(vec.astype("<f4").tobytes()).decode()
            else:
                value = vec.tolist()
            data.append({"object": "embedding", "index": i, "embedding": value})
        total = sum(lengths)
        return {
            "id": rid,
            "object": "list",
            "data": data,
            "model": self.served_name(prompts[0]),
            "usage": {"prompt_tokens": total, "total_tokens": total},
        }

    async def _prompts(self, req: EmbeddingRequest) -> list[Prompt]:
        x = req.input
        items: list = [x] if isinstance(x, str) or isinstance(x[0], int) else list(x)
        keep = req.truncate_prompt_tokens
        if keep == -1:
            keep = self.max_model_len - 1
        out = []
        for i, item in enumerate(items):
            if isinstance(item, str):
                if not item:
                    raise APIError(f"input[{i}] is an empty string", param="input")
                ids = await self.prompts.encode(item)
            else:
                ids = list(item)
            if not ids:
                raise APIError(f"input[{i}] has no tokens", param="input")
            if keep is not None:
                ids = ids[-keep:]
            if len(ids) >= self.max_model_len:  # (its one engine-side token needs a slot)
                raise APIError(
                    f"This model's maximum context length is {self.max_model_len} tokens; "
                    f"input[{i}] has {len(ids)} (embed at most {self.max_model_len - 1}, or "
                    "pass truncate_prompt_tokens)",
                    param="input",
                    code="context_length_exceeded",
                )
            self.check_ids(ids, "input")
            out.append(Prompt(item if isinstance(item, str) else None, ids))
        return out
