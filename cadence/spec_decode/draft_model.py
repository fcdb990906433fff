"""Draft-model proposals: a smaller model with the target's tokenizer guesses k tokens.

The draft keeps its own K/V (one tensor per layer, same block ids and slots as the target;
the pool sizing counts both). After each verification, per request that ran this step:

    catch-up   one forward over the positions the target computed and kept this step,
               plus the target's new token: [start, valid_end] (a prefill chunk:
               [start, start + n)), so the draft's K/V matches the target's everywhere
               the target's is valid; its last logits give draft token 1 (on a GPU,
               a CUDA graph of the step's token bucket where one is captured)
    k - 1 steps  one token each, greedy, at the next positions (the lookahead slots the
               KV manager reserved); on a GPU these replay CUDA graphs of the draft

Rejected guesses leave K/V past the request's valid end; the next catch-up overwrites it.
"""

from __future__ import annotations

import logging

import numpy as np
import torch

from cadence.layers.sampler import _argmax
from cadence.loader.loader import load_hf_config, load_model
from cadence.loader.model_path import resolve_model_path
from cadence.spec_decode.proposer import ModelProposer, StepRecord
from cadence.worker.backends import make_attention_backend
from cadence.worker.batch_inputs import StepLayout, eager_inputs, layout
from cadence.worker.block_tables import BlockTables
from cadence.worker.drafter import TargetView

logger = logging.getLogger(__name__)


class DraftModelProposer(ModelProposer):
    def __init__(self, k: int, model: str, target: TargetView) -> None:
        super().__init__(k, target)
        path = resolve_model_path(model)
        hf_config = load_hf_config(path)
        draft_vocab = int(hf_config.vocab_size)
        if draft_vocab > target.vocab_size:
            raise ValueError(
                f"the draft model's vocabulary ({draft_vocab}) is larger than the target's "
                f"({target.vocab_size}): it must share the target's tokenizer"
            )
        self.backend = make_attention_backend(
            target.config.attention_backend, target.device, hf_config
        )
        mc = target.config.model
        # Its guesses run up to k positions past the target's context.
        self.model = load_model(
            path,
            hf_config,
            target.dtype,
            target.device,
            self.backend,
            target.max_model_len + k,
            mc.load_format,
            mc.seed,
        )
        self.kv_model = self.model
        logger.info("draft model %s: %d layers", path, hf_config.num_hidden_layers)

    def capture_graphs(self) -> None:
        if self.backend.capabilities.decode_graphs:
            self.capture_step_graphs(self.backend, self.model, self.model, "draft model")

    @torch.inference_mode()
    def propose(self, step: StepRecord, max_drafts: list[int]) -> list[list[int]]:
        r, tables = self.target, step.tables
        dev, bs = r.device, r.block_size
        ids: list[int] = []
        rows, starts, qlens = [], [], []
        last_rows: list[int] = []  # each proposing request's last catch-up token
        proposing: list[int] = []  # its index in the step
        for i, tokens in enumerate(step.token_ids):
            start = int(step.layout.starts[i])
            end = step.valid_ends[i] + step.sampled[i]  # the new token too, if any
            ids.extend(tokens[start:end])
            rows.append(int(step.layout.rows[i]))
            starts.append(start)
            qlens.append(end - start)
            if step.sampled[i] and max_drafts[i] > 0:
                last_rows.append(len(ids) - 1)
                proposing.append(i)
        lay = layout(rows, starts, qlens, tables, bs)
        hidden = self._catch_up(lay, ids, tables)
        if not proposing:
            return [[] for _ in step.token_ids]
        last = torch.tensor(last_rows, dtype=torch.int64, device=dev)
        token = _argmax(self.model.compute_logits(hidden[last]))
        guesses = [token]
        prop_rows = lay.rows[proposing]
        positions = np.array([step.valid_ends[i] + 1 for i in proposing], dtype=np.int64)
        for _ in range(max(max_drafts[i] for i in proposing) - 1):
            token = self._decode(token, prop_rows, positions, tables)
            guesses.append(token)
            positions = positions + 1
        return self.read_back(guesses, proposing, max_drafts, len(step.token_ids))

    def _catch_up(self, lay: StepLayout, ids: list[int], tables: BlockTables) -> torch.Tensor:
        """The draft's forward over the step's kept positions (writes its K/V)."""
        r = self.target
        size = self.mixed.size_for(lay.query_lens, lay.seq_lens) if self.mixed else None
        if size is not None:
            tokens = np.stack([np.array(ids, dtype=np.int64), lay.positions, lay.slots])
            width = int(tables.num_blocks[lay.rows].max())
            return self.mixed.run(
                size, tokens, lay.query_lens, lay.seq_lens, lay.rows, tables, width
            )
        ids_d, pos_d, meta = eager_inputs(lay, ids, tables, self.backend, r.device, r.block_size)
        return self.model(ids_d, pos_d, meta)

    def _decode(
        self, token: torch.Tensor, rows: np.ndarray, positions: np.ndarray, tables: BlockTables
    ):
        """One greedy step of the draft: `token` (on the device) at `positions`."""
        r = self.target
        bs = r.block_size
        lay = layout(rows, positions, np.ones_like(positions), tables, bs)
        n = len(rows)
        size = self.graphs.size_for(n) if self.graphs is not None else None
        if size is not None:
            fill = (torch.arange(n, device=r.device), token)
            inputs = np.stack(
                [np.zeros(n, dtype=np.int64), positions, lay.slots, lay.seq_lens, rows]
            )
            width = int(tables.num_blocks[rows].max())
            hidden = self.graphs.run(size, inputs, tables, width, fill)
        else:
            _, pos_d, meta = eager_inputs(lay, np.zeros(n), tables, self.backend, r.device, bs)
            hidden = self.model(token, pos_d, meta)
        return _argmax(self.model.compute_logits(hidden))
