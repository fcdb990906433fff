"""Speculative decoding: proposers guess the next tokens, the target verifies them in one
forward pass (`--speculative-config`).

    proposer.py           the Proposer seam and the StepRecord each proposer reads
    ngram.py              prompt lookup (no model)
    draft_model.py        a smaller model with its own K/V in the target's blocks
    eagle3.py             EAGLE-3 heads over three of the target's layers
    rejection_sampler.py  exact verification: greedy and sampled rows
    decoder.py            SpecDecoder, behind the worker's Drafter seam (worker/drafter.py):
                          verify this step, propose the next; built by the executor

The scheduler sees drafts only as extra scheduled tokens (`Request.spec_token_ids`,
`SchedulerOutput.spec_token_ids`); see cadence/core/scheduler.py.
"""
