"""The CPU KV pool's default size (cadence/worker/memory_profile.py): the smallest of a fixed
number of tokens (at least one max_model_len sequence), twice what the scheduler can fill
at once, and a share of the available memory;
the choice and its reason are logged; `--kv-cache-memory` and a block count override it."""

import logging
from types import SimpleNamespace

import pytest
import torch

from cadence.worker import memory_profile

BLOCK = 1 << 20  # bytes a block, a round number for the arithmetic
TOKENS = 16  # tokens a block


def runner(max_num_seqs=4, blocks_per_seq=8, groups=1, kv_cache_memory=None, override=None):
    config = SimpleNamespace(
        cache=SimpleNamespace(num_gpu_blocks_override=override, kv_cache_memory=kv_cache_memory),
        scheduler=SimpleNamespace(max_num_seqs=max_num_seqs),
    )
    return SimpleNamespace(
        config=config,
        device=torch.device("cpu"),
        block_size=TOKENS,
        max_blocks_per_seq=blocks_per_seq,
        kv_groups=SimpleNamespace(num_groups=groups),
    )


@pytest.fixture
def plenty(monkeypatch):
    monkeypatch.setattr(memory_profile, "_available_memory", lambda: 64 * 2**30)


def test_a_small_scheduler_bounds_the_pool_and_says_so(plenty, caplog):
    with caplog.at_level(logging.INFO, logger=memory_profile.__name__):
        blocks = memory_profile.num_kv_blocks(runner(max_num_seqs=4, blocks_per_seq=8), BLOCK)
    assert blocks == 2 * 4 * 8 + 1
    assert "twice max_num_seqs x max_model_len" in caplog.text


def test_every_kv_group_needs_its_own_blocks(plenty):
    assert memory_profile.num_kv_blocks(runner(groups=2), BLOCK) == 2 * 4 * 8 * 2 + 1


def test_a_large_scheduler_gets_the_default_tokens(plenty, caplog):
    with caplog.at_level(logging.INFO, logger=memory_profile.__name__):
        blocks = memory_profile.num_kv_blocks(runner(max_num_seqs=256, blocks_per_seq=512), BLOCK)
    assert blocks == memory_profile.DEFAULT_CPU_KV_TOKENS // TOKENS
    assert "the default" in caplog.text
    with_windows = runner(max_num_seqs=256, blocks_per_seq=512, groups=2)
    assert memory_profile.num_kv_blocks(with_windows, BLOCK) == 2 * blocks  # a list per group


def test_the_default_holds_one_sequence_of_max_model_len(plenty):
    long = memory_profile.DEFAULT_CPU_KV_TOKENS // TOKENS * 4  # blocks of a 131k context
    assert memory_profile.num_kv_blocks(runner(max_num_seqs=8, blocks_per_seq=long), BLOCK) == (
        long + 1
    )


def test_a_machine_short_of_memory_gets_a_quarter_of_what_is_free(monkeypatch, caplog):
    monkeypatch.setattr(memory_profile, "_available_memory", lambda: 400 * 2**20)
    with caplog.at_level(logging.INFO, logger=memory_profile.__name__):
        blocks = memory_profile.num_kv_blocks(runner(max_num_seqs=256, blocks_per_seq=512), BLOCK)
    assert blocks == 100
    assert "25% of the available memory" in caplog.text


def test_the_flags_override_the_default(plenty):
    asked = runner(max_num_seqs=256, blocks_per_seq=512, kv_cache_memory=3 * 2**30)
    assert memory_profile.num_kv_blocks(asked, BLOCK) == 3 * 2**10
    assert memory_profile.num_kv_blocks(runner(override=7), BLOCK) == 7


def test_no_room_for_one_block_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(memory_profile, "_available_memory", lambda: 1000)
    with pytest.raises(ValueError, match="no room for KV blocks"):
        memory_profile.num_kv_blocks(runner(), BLOCK)
