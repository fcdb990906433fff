"""/v1/completions: prompts (text, ids, or lists of either) to text, streamed or not.

Every prompt of a request runs at once in the engine; the request is admitted as a whole
(prompts x samples sequences). `best_of` samples that many and returns the best `n` by
cumulative logprob; `echo` with `logprobs` returns the prompt tokens' logprobs as well.
"""

from __future__ import annotations

import asyncio

from cadence.entrypoints.errors import APIError
from cadence.entrypoints.logprobs_format import join_completion_logprobs
from cadence.entrypoints.openai_protocol import CompletionRequest, now, random_id
from cadence.entrypoints.serving import Prompt, Serving, finish_reason
from cadence.entrypoints.streaming import DONE, StreamCursor, merge
from cadence.sampling_params import SamplingParams


class CompletionServing(Serving):
    async def prompts_of(self, req: CompletionRequest) -> list[Prompt]:
        p = req.prompt
        if isinstance(p, str):
            items: list = [p]
        elif all(isinstance(x, int) for x in p):
            items = [p]
        else:
            items = list(p)
        out = []
        for item in items:
            if isinstance(item, str):
                out.append(Prompt(item, await self.prompts.encode(item)))
            else:
                if not item:
                    raise APIError("prompt must not be empty", param="prompt")
                self.check_ids(item)
                out.append(Prompt(None, list(item)))
        if not out:
            raise APIError("prompt must not be empty", param="prompt")
        return out

    def _request_params(self, req: CompletionRequest, prompt: Prompt) -> SamplingParams:
        params = self.sampling_params(req, req.max_tokens, req.logprobs, len(prompt.token_ids))
        if req.best_of is not None and req.best_of > req.n:
            # The best n of best_of by cumulative logprob: every sample needs its logprobs.
            params.n = req.best_of
            if params.logprobs is None:
                params.logprobs = 0
        if req.echo and req.logprobs is not None:
            params.prompt_logprobs = req.logprobs
        return params

    async def completions(self, req: CompletionRequest):
        lora = self.check_model(req.model)
        p = req.prompt
        single = isinstance(p, str) or all(isinstance(x, int) for x in p) or len(p) == 1
        self.check_transfer(req, 1 if single else len(p))
        if req.suffix:
            raise APIError("suffix is not supported", param="suffix")
        if req.best_of is not None:
            if req.best_of < req.n:
                raise APIError(
                    f"best_of ({req.best_of}) must be at least n ({req.n})", param="best_of"
                )
            if req.stream and req.best_of > req.n:
                raise APIError("best_of > n cannot be streamed", param="best_of")
        prompts = await self.prompts_of(req)
        for prompt in prompts:
            prompt.lora = lora
        params = [self._request_params(req, p) for p in prompts]
        num_seqs = sum(p.n for p in params)
        self.admission.check_size(num_seqs, [len(p.token_ids) for p in prompts])
        await self.check_structured(params[0])
        base_id = random_id("cmpl")
        created = now()
        if req.stream:
            return self._stream(req, base_id, created, prompts, params, num_seqs)
        with self.admission.admit(num_seqs, [len(p.token_ids) for p in prompts]) as ticket:
            try:
                async with asyncio.TaskGroup() as group:  # one failure cancels the rest
                    tasks = [
                        group.create_task(
                            self.final(
                                f"{base_id}-{i}",
                                prompt,
                                p,
                                req.priority,
                                lambda i=i: ticket.started(i),
                            )
                        )
                        for i, (prompt, p) in enumerate(zip(prompts, params))
                    ]
            except BaseExceptionGroup as eg:
                raise eg.exceptions[0] from None
        states = [t.result() for t in tasks]
        choices = []
        for i, (prompt, state) in enumerate(zip(prompts, states)):
            outs = [s.output for s in state.samples]
            if len(outs) > req.n:  # best_of: keep the n likeliest
                outs = sorted(outs, key=lambda o: -(o.cumulative_logprob or 0.0))[: req.n]
            echo = await self._echo_text(prompt) if req.echo else ""
            for j, out in enumerate(outs):
                logprobs = None
                if req.logprobs is not None:
                    logprobs = self.logprobs.completion(
                        out.token_ids, out.logprobs, req.logprobs, len(echo)
                    )
                    if req.echo:
                        logprobs = join_completion_logprobs(
                            self._prompt_logprobs(prompt, state, req.logprobs), logprobs
                        )
                choices.append(
                    {
                        "index": i * req.n + j,
                        "text": echo + out.text,
                        "logprobs": logprobs,
                        "finish_reason": finish_reason(out.finish_reason),
                        "stop_reason": out.stop_reason,
                    }
                )
        return {
            "id": base_id,
            "object": "text_completion",
            "created": created,
            "model": self.served_name(prompts[0]),
            "choices": choices,
            "usage": self.usage(prompts, states),
        }

    async def _echo_text(self, prompt: Prompt) -> str:
        if prompt.text is not None:
            return prompt.text
        return await self.prompts.decode(prompt.token_ids)

    def _prompt_logprobs(self, prompt: Prompt, state, k: int) -> dict:
        return self.logprobs.completion(prompt.token_ids, state.prompt_logprobs, k)

    async def _stream(self, req, base_id, created, prompts, params, num_seqs):
        # Admission for every prompt at once, before the first chunk (and the 200) goes out.
        with self.admission.admit(num_seqs, [len(p.token_ids) for p in prompts]) as ticket:
            async for event in self._stream_admitted(
                req, base_id, created, prompts, params, ticket
            ):
                yield event

    async def _stream_admitted(self, req, base_id, created, prompts, params, ticket):
        stream_options = req.stream_options
        include_usage = bool(stream_options and stream_options.include_usage)
        continuous = bool(stream_options and stream_options.continuous_usage_stats)
        cursors = [StreamCursor(self.client.output_processor, p.n) for p in params]
        model = self.served_name(prompts[0])
        echoed = [[not req.echo] * p.n for p in params]
        finals: list = [None] * len(prompts)
        runs = [
            self.run(f"{base_id}-{i}", prompt, p, req.priority, lambda i=i: ticket.started(i))
            for i, (prompt, p) in enumerate(zip(prompts, params))
        ]
        async for i, state in merge(runs):
            prompt = prompts[i]
            finals[i] = state
            for out, delta, new_ids, new_lps, finished in cursors[i].deltas(state):
                lp = None
                if req.logprobs is not None and new_ids:
                    lp = self.logprobs.completion(new_ids, new_lps, req.logprobs)
                if not echoed[i][out.index]:
                    echo = await self._echo_text(prompt)
                    delta = echo + delta
                    if lp is not None:
                        lp = self.logprobs.completion(new_ids, new_lps, req.logprobs, len(echo))
                        lp = join_completion_logprobs(
                            self._prompt_logprobs(prompt, state, req.logprobs), lp
                        )
                    echoed[i][out.index] = True
                choice = {
                    "index": i * req.n + out.index,
                    "text": delta,
                    "logprobs": lp,
                    "finish_reason": finish_reason(out.finish_reason) if finished else None,
                    "stop_reason": out.stop_reason if finished else None,
                }
                usage = self.usage(prompts, finals) if continuous else None
                yield self.chunk(base_id, "text_completion", created, [choice], usage, model)
        if include_usage:
            yield self.chunk(
                base_id, "text_completion", created, [], self.usage(prompts, finals), model
            )
        yield DONE
