"""What a request must satisfy before the core queues it: the checks that need the model
(its context and vocabulary) and the deployment (which prefill engines it may name). The
API server checks shapes and types before this; these raise ValueError naming the problem
(the server answers 400, the offline API raises it to the caller)."""

from __future__ import annotations

from dataclasses import dataclass

from cadence.kv_transfer.params import check_kv_transfer_params
from cadence.multimodal.inputs import ImageInput, check_images
from cadence.sampling_params import SamplingParams


@dataclass(frozen=True)
class RequestChecks:
    max_model_len: int  # tokens: prompt + output
    vocab_size: int
    prefill_addrs: frozenset[str] | None  # prefill engines a request may name (None: any)
    image_token_id: int | None = None  # a vision-language model's placeholder token
    whole_image_tokens: int | None = None  # the most tokens an image prefilled whole may take

    def check(
        self,
        prompt_token_ids: list[int],
        params: SamplingParams,
        images: list[ImageInput] | None = None,
    ) -> None:
        """Raise ValueError if the request cannot run here; fill in max_tokens (what the
        context leaves) when the caller gave none."""
        params.verify(self.vocab_size)
        check_kv_transfer_params(params.kv_transfer_params, self.prefill_addrs)
        if not prompt_token_ids:
            raise ValueError("the prompt is empty")
        n = len(prompt_token_ids)
        if n >= self.max_model_len:
            raise ValueError(
                f"the prompt has {n} tokens; this model's context holds {self.max_model_len} "
                "(prompt + at least one new token)"
            )
        bad = [t for t in prompt_token_ids if not 0 <= t < self.vocab_size]
        if bad:
            raise ValueError(
                f"prompt token id {bad[0]} is outside the vocabulary [0, {self.vocab_size})"
            )
        check_images(images or [], prompt_token_ids, self.image_token_id)
        longest = max((image.length for image in images or []), default=0)
        if self.whole_image_tokens is not None and longest > self.whole_image_tokens:
            raise ValueError(
                f"an image of {longest} tokens, which this model prefills in one step: a "
                f"step holds {self.whole_image_tokens} (--max-num-batched-tokens)"
            )
        if params.max_tokens is None:
            params.max_tokens = self.max_model_len - n
