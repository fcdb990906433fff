"""EAGLE-3 proposals: one decoder layer that drafts from the target's own hidden states.

The public checkpoint format (config.json with `draft_vocab_size`, optional
`eagle_config.eagle_aux_hidden_state_layer_ids`; safetensors):

    fc.weight                         [H, 3 * H_target]  the three target layers, fused
    midlayer.input_layernorm.weight   [H]   norms the token's embedding
    midlayer.hidden_norm.weight       [H]   norms the hidden state
    midlayer.self_attn.{q,k,v,o}_proj [.., 2 * H] in: embedding and hidden, side by side
    midlayer.post_attention_layernorm, midlayer.mlp.{gate,up,down}_proj
    norm.weight, lm_head.weight       [draft_vocab, H]
    d2t                               [draft_vocab] target id = draft id + d2t[draft id]
    t2d                               (unused here)
    embed_tokens.weight               optional; else the target's embedding is shared

Alignment: at position p the head sees (hidden state h_p, embedding of token p + 1) and
guesses token p + 2. After verification it catches up over the positions the target kept
this step, with the target's hidden states (fc of the residual stream entering three of its
layers), then drafts k - 1 more tokens from its own pre-norm output as the next hidden state.
"""

from __future__ import annotations

import json
import logging
import os

import numpy as np
import torch
from torch import nn

from cadence.layers.embedding import ParallelLMHead, VocabParallelEmbedding
from cadence.layers.linear import ColumnParallelLinear, shape_of
from cadence.layers.norm import RMSNorm
from cadence.layers.rotary import RotaryEmbedding
from cadence.layers.sampler import _argmax
from cadence.loader.loader import iter_safetensors, load_hf_config
from cadence.loader.model_path import resolve_model_path
from cadence.models.attention import Attention, AttentionOptions
from cadence.models.mlp import GatedMLP
from cadence.spec_decode.proposer import ModelProposer, StepRecord
from cadence.worker.backends import make_attention_backend
from cadence.worker.batch_inputs import StepLayout, eager_inputs, layout
from cadence.worker.block_tables import BlockTables
from cadence.worker.drafter import TargetView
from cadence.worker.mixed_graphs import BUCKETS

logger = logging.getLogger(__name__)

# checkpoint piece -> (our module, shard of the fused weight)
_FUSED = {
    "q_proj": ("self_attn.qkv_proj", 0),
    "k_proj": ("self_attn.qkv_proj", 1),
    "v_proj": ("self_attn.qkv_proj", 2),
    "gate_proj": ("mlp.gate_up_proj", 0),
    "up_proj": ("mlp.gate_up_proj", 1),
}


def aux_layer_ids(eagle_config: dict, num_target_layers: int) -> tuple[int, ...]:
    """The target layers whose incoming hidden states feed the head: the checkpoint's
    choice, else EAGLE-3's default (early, middle, late)."""
    ids = (eagle_config or {}).get("eagle_aux_hidden_state_layer_ids")
    if ids:
        return tuple(int(i) for i in ids)
    n = num_target_layers
    return (2, n // 2, n - 3) if n >= 4 else (0, n // 2, n - 1)


class Eagle3Head(nn.Module):
    def __init__(self, config, backend, max_position: int, target_hidden: int, vocab: int):
        super().__init__()
        h = config.hidden_size
        self.draft_vocab = int(getattr(config, "draft_vocab_size", None) or config.vocab_size)
        head_dim = getattr(config, "head_dim", None) or h // config.num_attention_heads
        self.rotary = RotaryEmbedding(config, head_dim, max_position)
        self.fc = nn.Linear(3 * target_hidden, h, bias=False)
        self.input_layernorm = RMSNorm(h, config.rms_norm_eps)
        self.hidden_norm = RMSNorm(h, config.rms_norm_eps)
        self.self_attn = Attention(config, backend, AttentionOptions())
        # Its q/k/v read the embedding and the hidden state side by side.
        self.self_attn.qkv_proj = ColumnParallelLinear(
            2 * h, self.self_attn.qkv_proj.shards, bias=False
        )
        self.post_attention_layernorm = RMSNorm(h, config.rms_norm_eps)
        self.mlp = GatedMLP(config)
        self.norm = RMSNorm(h, config.rms_norm_eps)
        self.lm_head = ParallelLMHead(self.draft_vocab, h)
        self.embed_tokens: VocabParallelEmbedding | None = None  # set if the checkpoint has one
        self.register_buffer("d2t", torch.zeros(self.draft_vocab, dtype=torch.int64))
        self._vocab = vocab
        self._hidden = h

    def attention_layers(self) -> list[Attention]:
        return [self.self_attn]

    def forward(self, ids, positions, hidden_in, meta, embed) -> tuple[torch.Tensor, torch.Tensor]:
        """(normed output for the logits, pre-norm output: the next step's hidden state)."""
        emb = embed(ids)
        cos_sin = {"global": self.rotary.lookup(positions, emb.dtype)}
        x = torch.cat([self.input_layernorm(emb), self.hidden_norm(hidden_in)], dim=-1)
        attn = self.self_attn(cos_sin, self.self_attn.qkv_proj(x), meta)
        x, residual = self.post_attention_layernorm(attn, hidden_in)
        x = self.mlp(self.mlp.gate_up_proj(x))
        return self.norm(x, residual)

    def guess(self, normed: torch.Tensor) -> torch.Tensor:
        """Greedy draft tokens, as target-vocabulary ids."""
        draft_ids = _argmax(self.lm_head.logits(normed))
        return draft_ids + self.d2t[draft_ids]

    def load_weights(self, weights) -> None:
        modules = dict(self.named_modules())
        params = dict(self.named_parameters())
        loaded: set[str] = set()
        for name, source in weights:
            name = name.removeprefix("model.")
            name = name.removeprefix("midlayer.").removeprefix("layers.0.")
            if name == "t2d":
                continue
            if name == "d2t":
                self.d2t.copy_(source[:].to(torch.int64))
                loaded.add(name)
                continue
            if name == "embed_tokens.weight":
                self.embed_tokens = VocabParallelEmbedding(self._vocab, self._hidden).to(
                    self.d2t.device, self.fc.weight.dtype
                )
                self.embed_tokens.load("weight", source)
                continue
            shard = 0
            for piece, (fused, index) in _FUSED.items():
                if f".{piece}." in name:
                    name, shard = f"{fused}.{name.rpartition('.')[2]}", index
                    break
            owner, _, kind = name.rpartition(".")
            module = modules.get(owner)
            if name not in params or module is None:
                raise ValueError(f"unexpected weight {name!r} in the EAGLE-3 checkpoint")
            if hasattr(module, "load"):
                module.load(kind, source, shard)
            else:
                if shape_of(source) != tuple(params[name].shape):
                    raise ValueError(
                        f"{name}: checkpoint shape {shape_of(source)} != {tuple(params[name].shape)}"
                    )
                params[name].data.copy_(source[:])
            loaded.add(f"{name}#{shard}")
        expected = {
            f"{n}#{i}"
            for n in params
            for i in range(len(getattr(modules[n.rpartition(".")[0]], "shards", [0])))
        }
        missing = sorted(expected - loaded)
        if missing:
            raise ValueError(f"the EAGLE-3 checkpoint lacks {missing[:5]}")


class _GraphedStep(nn.Module):
    """The head as the CUDA graph classes capture a model, (ids, positions, meta) -> a
    tensor. The hidden-state input is read from `hidden_in`, which the caller fills
    before each replay. A catch-up step returns [T, 2 H] (normed output, then pre-norm);
    a guessing step (`guess`) returns the pre-norm output and leaves its guesses (target
    ids) in `guesses`, so one replay does the whole step."""

    def __init__(self, head: Eagle3Head, embed: nn.Module, max_rows: int, guess: bool):
        super().__init__()
        self.head = head
        self.embed = embed
        self.guess = guess
        w = head.fc.weight
        self.hidden_in = torch.zeros(max_rows, w.shape[0], dtype=w.dtype, device=w.device)
        self.guesses = torch.zeros(max_rows, dtype=torch.int64, device=w.device)

    def forward(self, ids, positions, meta) -> torch.Tensor:
        n = ids.shape[0]
        normed, prenorm = self.head(ids, positions, self.hidden_in[:n], meta, self.embed)
        if not self.guess:
            return torch.cat([normed, prenorm], dim=-1)
        self.guesses[:n].copy_(self.head.guess(normed))
        return prenorm


class Eagle3Proposer(ModelProposer):
    needs_aux_hidden = True

    def __init__(self, k: int, model: str, target: TargetView) -> None:
        super().__init__(k, target)
        path = resolve_model_path(model)
        config = load_hf_config(path)
        with open(os.path.join(path, "config.json")) as f:
            raw = json.load(f)
        target_hf = target.hf_config
        self.aux_layer_ids = aux_layer_ids(raw.get("eagle_config"), target_hf.num_hidden_layers)
        self.backend = make_attention_backend(
            target.config.attention_backend, target.device, config
        )
        prev = torch.get_default_dtype()
        torch.set_default_dtype(target.dtype)
        try:
            with torch.device(target.device):
                self.head = Eagle3Head(
                    config,
                    self.backend,
                    target.max_model_len + k,
                    int(raw.get("target_hidden_size") or target_hf.hidden_size),
                    target.vocab_size,
                )
        finally:
            torch.set_default_dtype(prev)
        self.head.rotary.cos = self.head.rotary.cos.float()
        self.head.rotary.sin = self.head.rotary.sin.float()
        if target.config.model.load_format == "dummy":
            gen = torch.Generator(device=target.device).manual_seed(target.config.model.seed)
            for name, p in self.head.named_parameters():
                p.data.fill_(1.0) if "norm" in name else p.data.uniform_(-0.02, 0.02, generator=gen)
        else:
            self.head.load_weights(iter_safetensors(path))
        self.embed = self.head.embed_tokens or target.model.embed_tokens
        self.kv_model = self.head
        # The head as its CUDA graphs run it (capture_graphs).
        self.guess_fn: _GraphedStep | None = None
        self.catch_up_fn: _GraphedStep | None = None
        logger.info(
            "EAGLE-3 head %s: draft vocabulary %d, target layers %s",
            path,
            self.head.draft_vocab,
            self.aux_layer_ids,
        )

    def capture_graphs(self) -> None:
        if not self.backend.capabilities.decode_graphs:
            return
        sc = self.target.config.scheduler
        max_batch = min(self.target.config.max_cuda_graph_batch_size, sc.max_num_seqs)
        self.guess_fn = _GraphedStep(self.head, self.embed, max_batch, guess=True)
        self.catch_up_fn = _GraphedStep(self.head, self.embed, BUCKETS[-1], guess=False)
        self.capture_step_graphs(self.backend, self.guess_fn, self.catch_up_fn, "EAGLE-3 head")

    def _catch_up(
        self, lay: StepLayout, ids: list[int], hidden_in: torch.Tensor, tables: BlockTables
    ):
        """(normed, pre-norm) outputs of the head over the step's kept positions."""
        r = self.target
        size = self.mixed.size_for(lay.query_lens, lay.seq_lens) if self.mixed else None
        if size is None:
            ids_d, pos_d, meta = eager_inputs(
                lay, ids, tables, self.backend, r.device, r.block_size
            )
            return self.head(ids_d, pos_d, hidden_in, meta, self.embed)
        self.catch_up_fn.hidden_in[: lay.num_tokens].copy_(hidden_in)
        tokens = np.stack([np.asarray(ids, dtype=np.int64), lay.positions, lay.slots])
        width = int(tables.num_blocks[lay.rows].max())
        out = self.mixed.run(size, tokens, lay.query_lens, lay.seq_lens, lay.rows, tables, width)
        return out.split(self.head.fc.weight.shape[0], dim=-1)

    def _guess(
        self, lay: StepLayout, token: torch.Tensor, hidden: torch.Tensor, tables: BlockTables
    ):
        """One guessing step from `token` (on the device): (next guesses, pre-norm output)."""
        r = self.target
        n = len(lay.rows)
        size = self.graphs.size_for(n) if self.graphs else None
        if size is None:
            _, pos_d, meta = eager_inputs(
                lay, np.zeros(n), tables, self.backend, r.device, r.block_size
            )
            normed, prenorm = self.head(token, pos_d, hidden, meta, self.embed)
            return self.head.guess(normed), prenorm
        self.guess_fn.hidden_in[:n].copy_(hidden)
        zeros = np.zeros(n, dtype=np.int64)
        inputs = np.stack([zeros, lay.positions, lay.slots, lay.seq_lens, lay.rows])
        width = int(tables.num_blocks[lay.rows].max())
        fill = (torch.arange(n, device=r.device), token)
        prenorm = self.graphs.run(size, inputs, tables, width, fill)
        # (A copy: the next replay overwrites the buffer.)
        return self.guess_fn.guesses[:n].clone(), prenorm

    @torch.inference_mode()
    def propose(self, step: StepRecord, max_drafts: list[int]) -> list[list[int]]:
        r, tables = self.target, step.tables
        dev, bs = r.device, r.block_size
        offsets = np.cumsum(step.layout.query_lens) - step.layout.query_lens
        ids, flat_rows, qlens, last_rows, proposing = [], [], [], [], []
        for i, tokens in enumerate(step.token_ids):
            start = int(step.layout.starts[i])
            n = step.valid_ends[i] - start  # positions with a kept target hidden state
            ids.extend(tokens[start + 1 : start + 1 + n])  # each position's next token
            flat_rows.extend(range(int(offsets[i]), int(offsets[i]) + n))
            qlens.append(n)
            if step.sampled[i] and max_drafts[i] > 0:
                last_rows.append(len(ids) - 1)
                proposing.append(i)
        lay = layout(step.layout.rows, step.layout.starts, qlens, tables, bs)
        aux = torch.cat(step.aux_hidden, dim=-1)
        rows_d = torch.tensor(flat_rows, dtype=torch.int64, device=dev)
        normed, prenorm = self._catch_up(lay, ids, self.head.fc(aux[rows_d]), tables)
        if not proposing:
            return [[] for _ in step.token_ids]
        last = torch.tensor(last_rows, dtype=torch.int64, device=dev)
        token, hidden = self.head.guess(normed[last]), prenorm[last]
        guesses = [token]
        rows = step.layout.rows[proposing]
        positions = np.array([step.valid_ends[i] for i in proposing], dtype=np.int64)
        for _ in range(max(max_drafts[i] for i in proposing) - 1):
            lay = layout(rows, positions, np.ones_like(positions), tables, bs)
            token, hidden = self._guess(lay, token, hidden, tables)
            guesses.append(token)
            positions = positions + 1
        return self.read_back(guesses, proposing, max_drafts, len(step.token_ids))
