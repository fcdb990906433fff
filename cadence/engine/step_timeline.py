"""The engine's step timeline: where each of the last N steps spent its time, and on what.

A step is one trip of the engine loop that ran the model. Its phases, in host wall-clock
time (milliseconds):

    schedule   the scheduler picks requests and blocks (and admits compiled grammars)
    prepare    the runner applies the step's deltas and builds the forward pass's inputs
    forward    the forward pass: on a CPU the whole computation; on a GPU the kernel
               launches (a CUDA graph replay), the device works on asynchronously
    sample     grammar masks, sampling and reading the tokens back: on a GPU this is where
               the host waits for the device, so the forward pass's device time shows here
    output     appending tokens, stop checks, freeing finished requests, and (in the
               served engine) encoding and sending the outputs to the API server

With async scheduling (the GPU default) one loop trip schedules and launches step N+1 and
reads back step N: the record is the trip's, its batch composition that of step N+1.

Recording costs a few `perf_counter()` calls and one list per step (about 2 us, measured in
benchmarks/step_timeline_cost.py), so it is always on; `--step-timeline-size 0` turns it off.
"""

from __future__ import annotations

import time
from collections import deque

PHASES = ("schedule", "prepare", "forward", "sample", "output")
SCHEDULE, PREPARE, FORWARD, SAMPLE, OUTPUT = range(len(PHASES))
# A step, as snapshot() returns it: these fields, in this order.
FIELDS = (
    "id",  # step number since start (1-based, counts recorded steps)
    "start",  # unix time the step began, seconds
    *(f"{p}_ms" for p in PHASES),
    "num_seqs",  # sequences in the batch
    "num_tokens",  # tokens in the forward pass (prefill + decode + drafts)
    "prefill_tokens",  # prompt tokens computed (chunks, recomputation after preemption)
    "decode_seqs",  # sequences past their prompt (one token each, plus drafts)
    "preempted",  # sequences preempted by this step's schedule
    "image_tokens",  # placeholder tokens filled with image features (vision-language models)
    "encode_ms",  # of prepare: the vision encoder's (host time, as forward's)
)


class StepTimeline:
    """A ring of the last `size` steps. The core calls begin(), lap(phase) at the end of
    each stretch of work (a phase may take several stretches: with async scheduling the
    sampling of step N+1 follows the output of step N), then commit(sched); size 0 records
    nothing (every call returns at once)."""

    def __init__(self, size: int) -> None:
        if size < 0:
            raise ValueError(f"step_timeline_size must be >= 0, got {size}")
        self.size = size
        self.records: deque[tuple] = deque(maxlen=size or 1)
        self.num_steps = 0  # steps that ran the model since start (counted even at size 0)
        self._wall0 = 0.0  # time.time() at begin()
        self._last = 0.0  # perf_counter() at the last lap (or begin)
        self._acc = [0.0] * len(PHASES)  # seconds per phase, this step

    def begin(self) -> None:
        if self.size:
            self._wall0 = time.time()
            self._last = time.perf_counter()
            self._acc = [0.0] * len(PHASES)

    def lap(self, phase: int, at: float | None = None) -> None:
        """The time since the last lap went to `phase` (ending now, or at perf_counter()
        time `at`)."""
        if self.size:
            now = time.perf_counter() if at is None else at
            self._acc[phase] += now - self._last
            self._last = now

    def commit(self, sched, images: tuple[int, int, float] | None = None) -> None:
        """Close the step begun last: `sched` is the SchedulerOutput it ran, `images` its
        (image tokens, images encoded, encoder seconds). A step that ran nothing is
        dropped. (Kept raw; snapshot() does the arithmetic.)"""
        if sched is None or sched.is_empty:
            return
        self.num_steps += 1
        if not self.size:
            return
        self.records.append(
            (
                self.num_steps,
                self._wall0,
                self._acc,
                len(sched.num_scheduled_tokens),
                sched.total_num_scheduled_tokens,
                sched.num_decode_tokens,
                sched.num_decode_seqs,
                len(sched.preempted_ids),
                images or (0, 0, 0.0),
            )
        )

    def add_output_time(self, seconds: float) -> None:
        """Add time spent on the last step's outputs after commit() (the served engine's
        send)."""
        if self.size and self.records:
            self.records[-1][2][OUTPUT] += seconds

    def snapshot(self, since: int = 0, limit: int | None = None) -> list[dict]:
        """The recorded steps with id > `since`, oldest first, at most the newest `limit`."""
        out = [r for r in self.records if r[0] > since] if self.size else []
        if limit is not None:
            out = out[-limit:] if limit > 0 else []
        return [
            dict(
                zip(
                    FIELDS,
                    (
                        step_id,
                        start,
                        *(round(t * 1e3, 4) for t in acc),
                        seqs,
                        tokens,
                        tokens - decode_tokens,
                        decode_seqs,
                        preempted,
                        images[0],
                        round(images[2] * 1e3, 4),
                    ),
                )
            )
            for step_id, start, acc, seqs, tokens, decode_tokens, decode_seqs, preempted, images in out
        ]
