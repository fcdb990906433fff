"""Images into a step: the vision encoder's output for the placeholder tokens a step runs,
and the rotary positions of families whose positions are not token indices (M-RoPE).

    feeder.plan(state, start, end, first_row)   per request with images: its query tokens
                                                [start, end) sit at the step's rows from
                                                first_row on
    feeder.take(layout) -> ImageRows | None      after planning every request: encode the
                                                images not cached (one batched call); the
                                                rows they fill with what; M-RoPE positions

A chunked prompt may split an image's placeholders across steps, and a prefix-cache hit
may start inside them: an image is encoded whole and its features kept by content hash
(LRU, up to `cache_tokens` rows), so each step takes the slice it runs and the next chunk,
a preempted request's recompute or another request with the same image reuses them.

A step that encodes one image alone replays it in a CUDA graph where the family has one
(worker/encoder_graphs.py).

An image its model attends both ways (Gemma 3, `bidirectional_images`): its tokens in
the step see keys up to its last token, which the scheduler put in the same step
(core/request.py `fit_chunk`); `take` writes those limits into the layout (`key_limits`).

M-RoPE (models/qwen2_vl.py): a request's text positions are shifted from its token indices
after an image; `take` writes the shifted positions into the step's layout (a one-stream
position, which graphs replay as any), and for a step that runs image tokens builds the
three streams, which the forward pass reads instead.
"""

from __future__ import annotations

import time
from collections import OrderedDict

import numpy as np
import torch

from cadence.config import EngineConfig
from cadence.models.vision_language import ImageRows
from cadence.multimodal.inputs import ImageInput
from cadence.worker.batch_inputs import StepLayout
from cadence.worker.encoder_graphs import EncoderGraphs
from cadence.worker.step_state import RequestState


class ImageFeeder:
    def __init__(self, model, device: torch.device, config: EngineConfig) -> None:
        self.model = model
        self.device = device
        # Encoder rows kept (LRU): a step's worth of tokens at least.
        self.cache_tokens = max(8192, config.scheduler.max_num_batched_tokens)
        # One image's encoder in a CUDA graph where the family has one (on a GPU, graphs on)
        self.graphs = None
        if device.type == "cuda" and not config.enforce_eager:
            self.graphs = EncoderGraphs(model, device)
        self.cache: OrderedDict[str, torch.Tensor] = OrderedDict()  # hash -> [rows, hidden]
        self.cached_rows = 0
        self.mrope = model.uses_mrope
        self.bidirectional = model.bidirectional_images
        self._limits: list[tuple[int, int, int]] = []  # rows [a, b) see keys up to position c
        self._planned: list[tuple[ImageInput, int, int, int]] = []  # image, lo, hi, row
        self._shifted: list[tuple[int, int, int, tuple]] = []  # row, start, end, mrope
        self.num_encoded = 0  # images run through the encoder (cache misses), since start
        self.num_reused = 0  # images a step found cached
        self.num_tokens = 0  # placeholder tokens filled with image features
        # The last step's (placeholder tokens filled, images encoded, encoder seconds: on
        # a GPU its launches, as the step timeline's forward phase), for the timeline.
        self.last: tuple[int, int, float] = (0, 0, 0.0)

    def plan(self, state: RequestState, start: int, end: int, first_row: int) -> None:
        for image in state.images:
            lo, hi = max(image.offset, start), min(image.end, end)
            if lo < hi:
                self._planned.append(
                    (image, lo - image.offset, hi - image.offset, first_row + lo - start)
                )
                if self.bidirectional:  # (the scheduler ran the rest of the image with them)
                    self._limits.append((first_row + lo - start, first_row + hi - start, hi - 1))
        if self.mrope:
            if state.mrope is None:
                state.mrope = self.model.mrope_positions(state.num_prompt_tokens, state.images)
            self._shifted.append((first_row, start, end, state.mrope))

    def take(self, layout: StepLayout) -> ImageRows | None:
        if self._limits:  # (layout.positions are still the tokens' indices here)
            limits = layout.positions.copy()
            for a, b, last in self._limits:
                limits[a:b] = last
            layout.key_limits, self._limits = limits, []
        three = self._positions(layout) if self._shifted else None
        self.last = (0, 0, 0.0)
        if not self._planned:
            return None
        planned, self._planned = self._planned, []
        encoded, t0 = self.num_encoded, time.perf_counter()
        features = self._features({image.content_hash: image for image, *_ in planned})
        rows = torch.cat([torch.arange(row, row + hi - lo) for _, lo, hi, row in planned])
        self.num_tokens += len(rows)
        self.last = (len(rows), self.num_encoded - encoded, time.perf_counter() - t0)
        embeds = torch.cat([features[image.content_hash][lo:hi] for image, lo, hi, _ in planned])
        if three is not None:
            three = torch.from_numpy(three).to(self.device, non_blocking=True)
        return ImageRows(rows.to(self.device, non_blocking=True), embeds, three)

    def _positions(self, layout: StepLayout) -> np.ndarray | None:
        """Shift the M-RoPE requests' positions in `layout` (a new array: the old one may be
        its `starts`); the three streams when the step runs image tokens, else None."""
        shifted, self._shifted = self._shifted, []
        flat = layout.positions.copy()
        prompt_rows = []
        for row, start, end, (table, delta) in shifted:
            prompt_end = min(end, table.shape[1])
            if start < prompt_end:
                flat[row : row + prompt_end - start] = table[0, start:prompt_end]
                prompt_rows.append((row, start, prompt_end, table))
            later = row + max(prompt_end - start, 0)
            flat[later : row + end - start] += delta
        layout.positions = flat
        if not self._planned:
            return None
        three = np.tile(flat, (3, 1))
        for row, start, end, table in prompt_rows:
            three[:, row : row + end - start] = table[:, start:end]
        return three

    def _features(self, images: dict[str, ImageInput]) -> dict[str, torch.Tensor]:
        """Every named image's encoder output: cached ones as they are, the rest encoded
        in one call and cached (evicting the least recently used beyond the budget, never
        one this step needs)."""
        out, missing = {}, []
        for key, image in images.items():
            cached = self.cache.get(key)
            if cached is None:
                missing.append(image)
            else:
                self.cache.move_to_end(key)
                out[key] = cached
        self.num_reused += len(out)
        if missing:
            encoded = self.graphs.encode(missing) if self.graphs is not None else None
            if encoded is None:
                encoded = self.model.encode_images(missing)
            for image, rows in zip(missing, encoded, strict=True):
                out[image.content_hash] = rows
                self.cache[image.content_hash] = rows
                self.cached_rows += rows.shape[0]
            self.num_encoded += len(missing)
        while self.cached_rows > self.cache_tokens and self.cache:
            key = next(iter(self.cache))
            if key in images:
                break  # the oldest is this step's: keep the rest too
            self.cached_rows -= self.cache.pop(key).shape[0]
        return out
