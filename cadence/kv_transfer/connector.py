"""The connector seam of disaggregated prefill/decode.

A prefill engine (`--kv-role prefill`) computes a prompt and keeps its K/V for a decode
engine (`--kv-role decode`), which loads it instead of computing it and generates from
there. Requests say what they want in `kv_transfer_params` (vLLM's name; the router fills
it in):

    prefill side   {"do_remote_decode": true, "transfer_id": T}
    decode side    {"do_remote_prefill": true, "remote_addr": "tcp://host:port", "transfer_id": T}

The seam, in tokens and block ids:

    scheduler side (one process: the engine core's)
        save(transfer_id, block_ids, num_tokens)    prefill: stage the finished request's K/V
        start_load(request_id, params, block_ids, start, end)
                                                    decode: fetch the K/V of tokens [start,
                                                    end) into these blocks, in the background
        finished_loads() -> [(request_id, error)]   loads that ended (error None: loaded)
    worker side (KVLayers: the K/V tensors, layer by layer)
        gather(block_ids) / to_host(...) / write(block_ids, layers, after)

The decode engine always computes the prompt's last token itself (its logits give the first
output token), so it loads at most prompt_len - 1 tokens, after its own prefix-cache hits.
A load that fails (the prefill engine gone, the transfer dropped) is not an error for the
request: it computes its prompt locally instead.
"""

from __future__ import annotations

import torch

from cadence.kv_transfer.params import DECODE, PREFILL  # noqa: F401 (re-exported)


class KVLayers:
    """The worker side: one engine's K/V tensors ([2, num_blocks, block_size, heads, dim]
    per layer), read and written by block ids.

    On a GPU the engine's kernels run on the default stream; copies into or out of host
    memory (or another GPU) run on `copy_stream`, ordered after an event the engine thread
    records (`engine_point`), so a transfer never holds up the engine's own kernels."""

    def __init__(self, kv_caches: list[torch.Tensor], block_size: int) -> None:
        if any(c.shape[0] != 2 for c in kv_caches):
            raise ValueError(
                "KV transfer moves K/V caches; this model caches a latent (multi-head latent "
                "attention), which disaggregated serving does not move yet"
            )
        self.kv_caches = kv_caches
        self.block_size = block_size
        self.device = kv_caches[0].device
        self.on_gpu = self.device.type == "cuda"
        self.copy_stream = torch.cuda.Stream(self.device) if self.on_gpu else None

    def layout(self) -> list[tuple[list[int], str]]:
        """Per layer: the shape of one block's K/V ([2, block_size, heads, dim]) and dtype."""
        return [([2, *c.shape[2:]], str(c.dtype).removeprefix("torch.")) for c in self.kv_caches]

    def block_shape(self, layer: int, num_blocks: int) -> tuple[int, ...]:
        """The shape of `num_blocks` blocks of one layer: [2, n, block, heads, dim]."""
        return (2, num_blocks, *self.kv_caches[layer].shape[2:])

    def nbytes(self, num_blocks: int) -> int:
        """Bytes of `num_blocks` blocks' K/V over all layers."""
        return sum(2 * num_blocks * c[0, 0].numel() * c.element_size() for c in self.kv_caches)

    def carve(self, flat: torch.Tensor, num_blocks: int) -> list[torch.Tensor]:
        """Views of a flat uint8 buffer of `nbytes(num_blocks)` bytes as each layer's
        [2, n, block, heads, dim], the layers back to back (how shm and cuda_ipc stage)."""
        views, at = [], 0
        for layer, cache in enumerate(self.kv_caches):
            size = 2 * num_blocks * cache[0, 0].numel() * cache.element_size()
            views.append(
                flat[at : at + size].view(cache.dtype).view(self.block_shape(layer, num_blocks))
            )
            at += size
        return views

    def engine_point(self) -> torch.cuda.Event | None:
        """An event after everything the engine thread has queued so far (None on the
        CPU). Call it on the engine thread."""
        if not self.on_gpu:
            return None
        event = torch.cuda.Event()
        event.record(torch.cuda.current_stream(self.device))
        return event

    def _ids(self, block_ids: list[int]) -> torch.Tensor:
        return torch.tensor(block_ids, dtype=torch.long, device=self.device)

    def gather(self, block_ids: list[int]) -> list[torch.Tensor]:
        """Each layer's K/V of these blocks, copied out of the pool on the pool's device
        (on a GPU: queued on the engine's stream, after the passes that wrote them)."""
        ids = self._ids(block_ids)
        return [cache.index_select(1, ids) for cache in self.kv_caches]

    def to_host(
        self, tensors: list[torch.Tensor], after, out: list[torch.Tensor] | None = None
    ) -> list[torch.Tensor]:
        """Device tensors (from `gather`) copied into host memory (`out`, or new tensors),
        on the copy stream after the event `after`. Blocks the calling thread until done:
        call it off the engine thread."""
        out = out if out is not None else [torch.empty(t.shape, dtype=t.dtype) for t in tensors]
        with torch.cuda.stream(self.copy_stream):
            self.copy_stream.wait_event(after)
            for src, dst in zip(tensors, out):
                dst.copy_(src)
        self.copy_stream.synchronize()
        return out

    def write(self, block_ids: list[int], layers, after) -> None:
        """Writes each layer's K/V (an iterable of [2, n, block, heads, dim] tensors, in
        host memory or on any GPU) into these blocks; returns when written. On a GPU the
        copies run on the copy stream after `after` (the blocks' previous owner may still
        be read by kernels queued before them)."""
        if not self.on_gpu:
            ids = self._ids(block_ids)
            for cache, kv in zip(self.kv_caches, layers, strict=True):
                cache.index_copy_(1, ids, kv)
            return
        with torch.cuda.stream(self.copy_stream):
            self.copy_stream.wait_event(after)
            ids = self._ids(block_ids)  # (on the copy stream: no wait for the engine's)
            for cache, kv in zip(self.kv_caches, layers, strict=True):
                cache.index_copy_(1, ids, kv.to(self.device, non_blocking=True))
        self.copy_stream.synchronize()
