"""Which rank holds which rows and columns, with no process group: each rank's layer is
built under a faked rank, loads from the full checkpoint tensor (or a safetensors slice,
which reads only its shard), and the ranks' pieces put back together give the whole."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from cadence.distributed import parallel_state
from cadence.distributed.parallel_state import TensorParallelGroup
from cadence.layers.embedding import VocabParallelEmbedding
from cadence.layers.linear import (
    ColumnParallelLinear,
    ColumnShard,
    RowParallelLinear,
    check_shardable,
)


@pytest.fixture
def as_rank(monkeypatch):
    """as_rank(r, n): layers built inside see rank r of n (no communication happens)."""

    def set_rank(rank: int, size: int) -> None:
        group = TensorParallelGroup(rank, size, torch.device("cpu"))
        monkeypatch.setattr(parallel_state, "_TP", group)

    yield set_rank


def test_kv_heads_split_or_replicated(as_rank):
    head_dim = 4
    held = []
    for rank in range(4):  # 8 q heads, 2 kv heads, 4 ranks (the table in linear.py)
        as_rank(rank, 4)
        q = ColumnShard.split(8 * head_dim, "heads")
        kv = ColumnShard.for_kv_heads(2, head_dim)
        held.append((q.start // head_dim, q.count // head_dim, kv.start // head_dim, kv.count))
    assert held == [(0, 2, 0, 4), (2, 2, 0, 4), (4, 2, 1, 4), (6, 2, 1, 4)]
    as_rank(1, 2)  # more KV heads than ranks: split
    assert ColumnShard.for_kv_heads(4, head_dim) == ColumnShard(16, 8, 8)


def test_fused_qkv_shards_put_back_together(as_rank):
    hidden, head_dim = 6, 2
    q, k, v = torch.randn(8, hidden), torch.randn(4, hidden), torch.randn(4, hidden)
    pieces = []
    for rank in range(2):  # 4 q heads, 2 kv heads over 2 ranks
        as_rank(rank, 2)
        q_shard = ColumnShard.split(8, "heads")
        kv_shard = ColumnShard.for_kv_heads(2, head_dim)
        layer = ColumnParallelLinear(hidden, [q_shard, kv_shard, kv_shard], bias=False)
        for i, t in enumerate((q, k, v)):
            layer.load("weight", t, i)
        pieces.append(layer.weight.split([4, 2, 2]))
    assert torch.equal(torch.cat([p[0] for p in pieces]), q)
    assert torch.equal(torch.cat([p[1] for p in pieces]), k)
    assert torch.equal(torch.cat([p[2] for p in pieces]), v)


def test_row_parallel_partial_sums_and_one_bias(as_rank):
    w, b, x = torch.randn(5, 8), torch.randn(5), torch.randn(3, 8)
    total = torch.zeros(3, 5)
    for rank in range(2):
        as_rank(rank, 2)
        layer = RowParallelLinear(8, 5, bias=True, what="features")
        layer.load("weight", w)
        layer.load("bias", b)
        total += F.linear(x[:, rank * 4 : (rank + 1) * 4], layer.weight, layer.local_bias)
    torch.testing.assert_close(total, F.linear(x, w, b))


def test_vocab_rows_and_logits(as_rank):
    vocab, hidden = 11, 4  # 11 rows over 2 ranks: 6 each, rank 1's last padded
    table, h = torch.randn(vocab, hidden), torch.randn(2, hidden)
    logits = []
    for rank in range(2):
        as_rank(rank, 2)
        emb = VocabParallelEmbedding(vocab, hidden)
        emb.load("weight", table)
        assert (emb.start, emb.end) == (rank * 6, min(rank * 6 + 6, vocab))
        logits.append(h @ emb.weight.t())
    torch.testing.assert_close(torch.cat(logits, -1)[:, :vocab], h @ table.t())


def test_loading_reads_only_the_shard_from_safetensors(as_rank, tmp_path):
    from safetensors import safe_open
    from safetensors.torch import save_file

    w = torch.randn(5, 8)
    save_file({"w": w}, str(tmp_path / "m.safetensors"))
    as_rank(1, 2)
    layer = RowParallelLinear(8, 5, bias=False, what="features")
    with safe_open(str(tmp_path / "m.safetensors"), framework="pt") as f:
        layer.load("weight", f.get_slice("w"))
    assert torch.equal(layer.weight, w[:, 4:])


def test_unshardable_models_are_refused_before_starting_ranks():
    from types import SimpleNamespace

    cfg = SimpleNamespace(num_attention_heads=9, num_key_value_heads=3, intermediate_size=1536)
    with pytest.raises(ValueError, match=r"attention heads \(9\) is not divisible by .* 2"):
        check_shardable(cfg, 2)
    check_shardable(cfg, 3)
    mqa = SimpleNamespace(num_attention_heads=8, num_key_value_heads=3, intermediate_size=64)
    with pytest.raises(ValueError, match="3 KV heads cannot be replicated evenly over 4"):
        check_shardable(mqa, 4)
