"""Structured outputs between the engine core and the scheduler.

    hold(request)         a constrained request waits here while its grammar compiles (on a
                          worker thread), so a slow schema delays only its own request
    admit(scheduler)      compiled ones join the scheduler; failed ones are reported
    fill_bitmask(...)     the step's allowed-token masks (filled while the forward runs)
    advance(sampled, ...) walk each grammar over its new tokens -> GrammarVerdicts: tokens
                          forced after them (jump-forward), grammars complete, drafts cut
                          to what the grammar allows; the scheduler reads them

The core's loop calls these at fixed points and never looks inside a grammar.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

import torch

from cadence.config import StructuredOutputsConfig
from cadence.core.request import Request
from cadence.core.scheduler import Scheduler
from cadence.core.scheduler_output import GrammarVerdicts, SampledTokens
from cadence.structured.manager import GrammarManager

logger = logging.getLogger(__name__)


class GrammarGate:
    def __init__(self, manager: GrammarManager, config: StructuredOutputsConfig) -> None:
        self.manager = manager
        self.config = config  # read at each step: jump_forward may be switched while serving
        self.awaiting: dict[str, Request] = {}  # compiling, not yet in the scheduler
        self._failed: list[tuple[str, str]] = []  # (request id, why) not yet reported

    @property
    def active(self) -> bool:
        """Some request in the scheduler is constrained (the step needs masks)."""
        return bool(self.manager.matchers)

    def hold(self, req: Request) -> None:
        self.awaiting[req.request_id] = req
        self.manager.submit(req.request_id, req.sampling_params.structured_outputs)

    def admit(self, scheduler: Scheduler) -> None:
        """Move requests whose grammar is ready into the scheduler. With nothing else to
        run, wait briefly for a compile instead of spinning."""
        if not self.awaiting:
            return
        idle = not scheduler.has_unfinished_requests()
        ready, failed = self.manager.poll(timeout=0.01 if idle else 0.0)
        for rid in ready:
            scheduler.add_request(self.awaiting.pop(rid))
        for rid, why in failed:
            self.awaiting.pop(rid, None)
            self._failed.append((rid, why))

    def take_failed(self) -> list[tuple[str, str]]:
        failed, self._failed = self._failed, []
        return failed

    def drop(self, request_id: str) -> bool:
        """Forget a request (ended, aborted); True if it was still waiting for its grammar."""
        waiting = self.awaiting.pop(request_id, None) is not None
        self.manager.remove(request_id)
        return waiting

    def fill_bitmask(self, sample_ids: list[str], drafts=None) -> torch.Tensor:
        return self.manager.fill_bitmask(sample_ids, drafts)

    def wants_jump_forward(self, requests: Mapping[str, Request]) -> bool:
        """A running constrained request could take forced tokens (no logprobs wanted)."""
        if not (self.manager.matchers and self.config.jump_forward):
            return False
        return any(
            rid in requests and requests[rid].sampling_params.logprobs is None
            for rid in self.manager.matchers
        )

    def advance(
        self, sampled: SampledTokens, requests: Mapping[str, Request], jump: bool = True
    ) -> GrammarVerdicts:
        """Walk each constrained request's grammar over its new tokens (accepted drafts,
        then the sampled one); forced tokens may follow. Its next drafts are cut to what
        the grammar allows from there."""
        verdicts = GrammarVerdicts(forced={}, done=set(), proposals={}, violated=set())
        jump = jump and self.config.jump_forward
        manager = self.manager
        for rid, token in sampled.sampled.items():
            req = requests.get(rid)
            if req is None or rid not in manager.matchers:
                continue
            params = req.sampling_params
            done, forced = False, []
            new_tokens = [*sampled.accepted_drafts.get(rid, ()), token]
            for i, t in enumerate(new_tokens, 1):
                # Forced tokens follow the last new token only, and have no logprobs of
                # their own: no jump when logprobs are wanted.
                may_jump = jump and params.logprobs is None and i == len(new_tokens)
                done, forced = manager.advance(rid, t, may_jump)
                if done:
                    break
            why = getattr(manager.matchers.get(rid), "violated", None)
            if why:  # nothing valid can follow: end it here
                logger.info("request %s ends without a valid output: %s", rid, why)
                verdicts.violated.add(rid)
                done = True
            if done:
                verdicts.done.add(rid)
            elif forced:
                verdicts.forced[rid] = forced
            if rid in sampled.proposals:
                verdicts.proposals[rid] = manager.allowed_prefix(
                    rid, sampled.proposals[rid], jump and params.logprobs is None
                )
        return verdicts

    def shutdown(self) -> int:
        return self.manager.shutdown()
