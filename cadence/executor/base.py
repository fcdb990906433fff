"""The seam between the engine core and the model's ranks: one Executor per engine.

The core calls it once per step, exactly as it would call a ModelRunner:

    out     = executor.execute_model(sched)    every rank applies the deltas, runs forward
    pending = executor.sample_async(out, mask) rank 0 samples; the others receive its ids
    sampled = executor.resolve(pending)        rank 0's ids on the host (the others mirror)

Rank 0 always runs in the caller's process (`driver`): it holds the logits, samples, and
is what the core reads results from, so one rank adds no hop. Executors differ only in
where the other ranks live: nowhere (`uniproc`), processes of this host (`mp`), or Ray
actors anywhere in a Ray cluster (`ray`). The scheduler does not know which one runs.

This class is the whole contract: the engine calls only what is spelled out here.
`driver` (rank 0's ModelRunner) is there for benchmarks, tools and tests that inspect the
model; the engine never reaches through it.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING

from cadence.config import EngineConfig, PoolingSpec
from cadence.core.scheduler_output import SampledTokens, SchedulerOutput
from cadence.lora_request import LoRARequest
from cadence.worker.drafter import DrafterFactory

if TYPE_CHECKING:
    import torch

    from cadence.worker.model_runner import ModelRunner
    from cadence.worker.step_state import ModelOutput, PendingSample


def drafter_factory(config: EngineConfig) -> DrafterFactory | None:
    """What every rank's runner builds its drafter with (speculative decoding), or None."""
    if config.speculative is None:
        return None
    from cadence.spec_decode.decoder import drafter_factory as spec_factory

    return spec_factory(config.speculative)


class Executor(ABC):
    driver: ModelRunner  # rank 0's runner, in this process (inspection only, see above)

    # ---- what the core reads about the model (rank 0's view) ---------------------------

    @property
    def num_blocks(self) -> int:
        return self.driver.num_blocks

    @property
    def max_model_len(self) -> int:
        return self.driver.max_model_len

    @property
    def vocab_size(self) -> int:
        return self.driver.vocab_size

    @property
    def eos_token_ids(self) -> tuple[int, ...]:
        return self.driver.eos_token_ids

    @property
    def model_path(self) -> str:
        return self.driver.model_path

    @property
    def pooling(self) -> PoolingSpec | None:
        """An embedding model's pooling (--runner pooling); None: a generative model."""
        return self.driver.pooling

    @property
    def image_token_id(self) -> int | None:
        """A vision-language model's image placeholder token; None: a text model."""
        return self.driver.image_token_id

    @property
    def whole_images(self) -> bool:
        """Whether each image must be prefilled in one step (its tokens attend to each
        other both ways: Gemma 3)."""
        feeder = self.driver.images
        return feeder is not None and feeder.bidirectional

    @property
    def pixel_dtype(self) -> str:
        """The dtype an image's float tensors are sent in: the model's (the encoder casts
        them to it anyway; bf16 halves the bytes of float32)."""
        return str(self.driver.dtype).removeprefix("torch.")

    @property
    def image_step(self) -> tuple[int, int, float] | None:
        """The last step's (image tokens, images encoded, encoder seconds); None: a text
        model."""
        feeder = self.driver.images
        return None if feeder is None else feeder.last

    @property
    def image_totals(self) -> tuple[int, int, int] | None:
        """(images encoded, images found in the encoder's cache, image tokens) since start."""
        feeder = self.driver.images
        return (
            None if feeder is None else (feeder.num_encoded, feeder.num_reused, feeder.num_tokens)
        )

    def check_images(self, images: list) -> None:
        """Refuse (ValueError) images this model's encoder cannot take."""
        self.driver.model.check_images(images)

    def check_lora(self, lora: LoRARequest) -> None:
        """Refuse (ValueError) an adapter this engine cannot run: LoRA is off, or the
        folder does not fit the model (every rank's model is the same)."""
        if self.driver.lora is None:
            raise ValueError("this engine serves no LoRA adapters (start it with --enable-lora)")
        self.driver.lora.check_request(lora)

    @property
    def kv_group_windows(self) -> tuple[int | None, ...]:
        """Per KV group, how far behind a query its layers read (None: the whole context).
        The KV manager keeps a block list per group and releases blocks behind windows."""
        return self.driver.kv_group_windows

    @property
    def kv_caches(self) -> list[torch.Tensor]:
        """Rank 0's K/V tensors, one per attention layer (a K/V connector moves them)."""
        return self.driver.kv_caches

    def request_ids(self) -> list[str]:
        """The requests whose rows the runners hold (a failed step leaves some behind)."""
        return list(self.driver.requests)

    @property
    def recoverable(self) -> bool:
        """Whether the engine may go on after a step raised. With one rank it may (the
        core ends that step's requests); with several, the ranks may be out of step in
        their collectives, which nothing can repair."""
        return True

    # ---- one step ------------------------------------------------------------------------

    @abstractmethod
    def execute_model(self, sched: SchedulerOutput) -> ModelOutput: ...

    @abstractmethod
    def sample_async(
        self, model_out: ModelOutput, grammar_bitmask: torch.Tensor | None = None
    ) -> PendingSample | None: ...

    @abstractmethod
    def resolve(self, pending: PendingSample | None) -> SampledTokens: ...

    def sample(
        self, model_out: ModelOutput, grammar_bitmask: torch.Tensor | None = None
    ) -> SampledTokens:
        return self.resolve(self.sample_async(model_out, grammar_bitmask))

    def execute(self, sched: SchedulerOutput) -> SampledTokens:
        """Forward pass and sampling with no grammar masks (tests and simple callers)."""
        return self.sample(self.execute_model(sched))

    @abstractmethod
    def shutdown(self) -> None:
        """Stop the other ranks and leave the process group. Idempotent."""
