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
    worker side (the K/V tensors, layer by layer)
        gather_layers(block_ids) / scatter_layer(layer, block_ids, tensor)

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
    per layer), read and written a layer at a time by block ids."""

    def __init__(self, kv_caches: list[torch.Tensor], block_size: int) -> None:
        self.kv_caches = kv_caches
        self.block_size = block_size

    def layout(self) -> list[tuple[list[int], str]]:
        """Per layer: the shape of one block's K/V ([2, block_size, heads, dim]) and dtype."""
        return [([2, *c.shape[2:]], str(c.dtype).removeprefix("torch.")) for c in self.kv_caches]

    def gather_layers(self, block_ids: list[int]):
        """Each layer's K/V of these blocks, copied to host memory: [2, n, block, heads, dim]."""
        ids = torch.tensor(block_ids, dtype=torch.long, device=self.kv_caches[0].device)
        for cache in self.kv_caches:
            yield cache.index_select(1, ids).to("cpu")

    def scatter_layer(self, layer: int, block_ids: list[int], kv: torch.Tensor) -> None:
        cache = self.kv_caches[layer]
        ids = torch.tensor(block_ids, dtype=torch.long, device=cache.device)
        cache.index_copy_(1, ids, kv.to(cache.device, non_blocking=False))
