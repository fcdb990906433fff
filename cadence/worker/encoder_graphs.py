"""The vision encoder of one image in a CUDA graph: a request with one new image, the
latency case, runs its encoder as one replay instead of a few hundred launches (a ViT of
32 layers is some 30 launches a layer; at one image these are the encoder's time).

A graph is captured the first time an image of a new key arrives (the key: what besides
the pixels the encoding depends on; Qwen-VL: the image's patch grid; a family of one image
size: one key), up to `max_graphs`, for images of up to MAX_GRAPH_PIXELS values; every
graph shares one memory pool and replays one at a time, and its output is copied out
before the next. Batches of several images, keys past the limit, larger images and
families without graphs (`VisionLanguageModel.graph_input` None) run eagerly as before.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Hashable

import torch

from cadence.multimodal.inputs import ImageInput

logger = logging.getLogger(__name__)


# Images of more pixel values than this run eagerly: their encoder is bound by its FLOPs,
# not its launches, and a graph's pool would keep their activations. (Qwen-VL at 448x448:
# 1.2 M; Gemma 3's 896x896: 2.4 M; LLaVA's 336x336: 0.3 M.)
MAX_GRAPH_PIXELS = 1 << 22


class EncoderGraphs:
    def __init__(self, model, device: torch.device, max_graphs: int = 8) -> None:
        self.model = model
        self.device = device
        self.max_graphs = max_graphs
        # key -> (graph, its pixel buffer, its output buffer, the body it replays: which
        # holds the tensors the graph reads besides the pixels, e.g. Qwen-VL's plan)
        self.graphs: dict[Hashable, tuple] = {}
        self.pool = None
        self.num_replays = 0

    @torch.inference_mode()
    def encode(self, images: list[ImageInput]) -> list[torch.Tensor] | None:
        """The images' encoder outputs from a graph, or None (encode them eagerly)."""
        staged = self.model.graph_input(images)
        if staged is None:
            return None
        key, pixels = staged
        entry = self.graphs.get(key)
        if entry is None:
            if len(self.graphs) >= self.max_graphs or pixels.numel() > MAX_GRAPH_PIXELS:
                return None
            entry = self.graphs[key] = self._capture(key, pixels)
        graph, static_pixels, output, _ = entry
        if output.shape[0] != images[0].length:  # (as encode_images checks its own)
            raise ValueError(
                f"the encoder made {output.shape[0]} rows for an image of {images[0].length} "
                "placeholder tokens"
            )
        static_pixels.copy_(pixels)
        graph.replay()
        self.num_replays += 1
        return [output.clone()]  # (the next replay, of any key, reuses the pool)

    def _capture(self, key: Hashable, pixels: torch.Tensor):
        t0 = time.perf_counter()
        body = self.model.graph_body(key)
        static_pixels = pixels.clone()
        stream = torch.cuda.Stream(self.device)
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(stream):
            body(static_pixels)  # warm-up: kernels and workspaces before the capture
            graph = torch.cuda.CUDAGraph()
            # (Captured while serving: other threads' CUDA calls must not break it.)
            with torch.cuda.graph(
                graph, pool=self.pool, stream=stream, capture_error_mode="thread_local"
            ):
                output = body(static_pixels)
        torch.cuda.current_stream(self.device).wait_stream(stream)
        self.pool = graph.pool()
        logger.info(
            "vision encoder graph %d captured for %s in %.2f s",
            len(self.graphs) + 1,
            key,
            time.perf_counter() - t0,
        )
        return graph, static_pixels, output, body
