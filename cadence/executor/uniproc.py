"""One rank, in this process: the model runner itself, behind the Executor interface."""

from __future__ import annotations

from cadence.config import EngineConfig
from cadence.executor.base import Executor, drafter_factory
from cadence.worker.model_runner import ModelRunner


class UniprocExecutor(Executor):
    def __init__(self, config: EngineConfig) -> None:
        self.driver = ModelRunner(config, drafter_factory=drafter_factory(config))

    # Looked up on the runner at each call (not bound once), so a test or the fault hook
    # that wraps the runner's method is obeyed.
    def execute_model(self, sched):
        return self.driver.execute_model(sched)

    def sample_async(self, model_out, grammar_bitmask=None):
        return self.driver.sample_async(model_out, grammar_bitmask)

    def resolve(self, pending):
        return self.driver.resolve(pending)

    def sample(self, model_out, grammar_bitmask=None):
        # The runner's own: with speculative decoding it verifies and proposes.
        return self.driver.sample(model_out, grammar_bitmask)

    def shutdown(self) -> None:
        """Nothing to stop: the one rank is this process."""
