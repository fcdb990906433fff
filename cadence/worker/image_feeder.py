"""Images into a step: the vision encoder's output for the placeholder tokens a step runs.

    feeder.plan(images, start, end, first_row)   per request: its tokens [start, end) sit
                                                 at the step's rows from first_row on
    feeder.take() -> (rows, embeddings) | None    after planning every request: encode the
                                                 images not cached (one batched call), and
                                                 the rows they fill with what

A chunked prompt may split an image's placeholders across steps, and a prefix-cache hit
may start inside them: an image is encoded whole and its features kept by content hash
(LRU, up to `cache_tokens` rows), so each step takes the slice it runs and the next chunk,
a preempted request's recompute or another request with the same image reuses them.
"""

from __future__ import annotations

from collections import OrderedDict

import torch

from cadence.multimodal.inputs import ImageInput


class ImageFeeder:
    def __init__(self, model, device: torch.device, cache_tokens: int) -> None:
        self.model = model
        self.device = device
        self.cache_tokens = cache_tokens
        self.cache: OrderedDict[str, torch.Tensor] = OrderedDict()  # hash -> [rows, hidden]
        self.cached_rows = 0
        self._planned: list[tuple[ImageInput, int, int, int]] = []  # image, lo, hi, row
        self.num_encoded = 0  # images run through the encoder (cache misses), since start
        self.num_reused = 0  # images a step found cached

    @property
    def pending(self) -> bool:
        """Whether the step being planned runs image tokens (it cannot replay a graph)."""
        return bool(self._planned)

    def plan(self, images: list[ImageInput], start: int, end: int, first_row: int) -> None:
        for image in images:
            lo, hi = max(image.offset, start), min(image.end, end)
            if lo < hi:
                self._planned.append(
                    (image, lo - image.offset, hi - image.offset, first_row + lo - start)
                )

    def take(self) -> tuple[torch.Tensor, torch.Tensor] | None:
        if not self._planned:
            return None
        planned, self._planned = self._planned, []
        features = self._features({image.content_hash: image for image, *_ in planned})
        rows = torch.cat([torch.arange(row, row + hi - lo) for _, lo, hi, row in planned])
        embeds = torch.cat([features[image.content_hash][lo:hi] for image, lo, hi, _ in planned])
        return rows.to(self.device, non_blocking=True), embeds

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
            for image, rows in zip(missing, self.model.encode_images(missing), strict=True):
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
