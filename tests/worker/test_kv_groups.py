"""How attention layers are grouped for the KV pool: by window, every group the same size so
that slot s of each group shares one tensor, with little padding; one group where every
block must stay with every layer."""

from __future__ import annotations

from cadence.worker.kv_groups import KVGroups, plan_kv_groups

G, L = None, 4096  # a global layer's window, a local one's


def test_alike_layers_make_one_group():
    assert plan_kv_groups([G] * 4) == KVGroups((None,), ((0, 1, 2, 3),))
    assert plan_kv_groups([L] * 3) == KVGroups((L,), ((0, 1, 2),))  # (Mistral: all slide)


def test_gemma2_alternating_layers_make_two_equal_groups():
    groups = plan_kv_groups([L, G] * 21)  # Gemma-2-9B: 42 layers, local first
    assert groups.windows == (None, L)  # the global group first
    assert groups.layers == (tuple(range(1, 42, 2)), tuple(range(0, 42, 2)))
    assert groups.num_slots == 21  # a block costs 21 layers' K/V, in either group


def test_gemma3_five_local_to_one_global_splits_the_local_layers():
    windows = [G if i % 6 == 5 else 1024 for i in range(26)]  # Gemma-3-1B: 4 global
    groups = plan_kv_groups(windows)
    assert groups.windows == (None,) + (1024,) * 6
    assert groups.num_slots == 4
    assert groups.layers[0] == (5, 11, 17, 23)
    assert sorted(i for layers in groups.layers[1:] for i in layers) == [
        i for i in range(26) if i % 6 != 5
    ]
    # 7 groups x 4 slots = 28 layers' memory for 26 layers: within the padding allowed.
    assert groups.num_groups * groups.num_slots - 26 <= 0.1 * 26


def test_the_group_size_shrinks_until_padding_is_small():
    windows = [G if i % 6 == 5 else L for i in range(62)]  # Gemma-3-27B: 10 global, 52 local
    groups = plan_kv_groups(windows)
    slots = groups.num_groups * groups.num_slots
    assert slots - 62 <= 0.1 * 62
    assert sorted(i for layers in groups.layers for i in layers) == list(range(62))


def test_no_split_keeps_one_group_windowed_only_where_every_layer_slides():
    assert plan_kv_groups([L, G, L], split=False) == KVGroups((None,), ((0, 1, 2),))
    assert plan_kv_groups([L, 2 * L], split=False) == KVGroups((2 * L,), ((0, 1),))


def test_the_runner_keeps_one_unreleased_group_for_disaggregation_and_drafters_kv():
    """Disaggregation moves whole prompts, and a draft model reads the whole context from
    the same blocks: nothing may be released, whatever the windows."""
    from types import SimpleNamespace

    from cadence.config import EngineConfig
    from cadence.worker.kv_groups import runner_kv_groups

    layers = [SimpleNamespace(window=w, num_kv_heads=2, head_dim=16) for w in (L, G, L)]
    config = EngineConfig()
    assert runner_kv_groups(layers, config).num_groups == 3
    drafter = SimpleNamespace(kv_bytes_per_block=lambda: 1024)
    assert runner_kv_groups(layers, config, drafter) == KVGroups((None,), ((0, 1, 2),))
    all_slide = [SimpleNamespace(window=L, num_kv_heads=2, head_dim=16)] * 2
    assert runner_kv_groups(all_slide, config, drafter).windows == (None,)
    config.kv_role = "prefill"
    assert runner_kv_groups(all_slide, config).windows == (None,)
