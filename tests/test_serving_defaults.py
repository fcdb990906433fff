"""Defaults that depend on what the engine is for: `cadence serve` on a GPU bounds the prompt
tokens a step takes beside decodes so that the step fits the largest mixed-step CUDA graph,
paces them from measured step times, and replays such steps in graphs (streams'
inter-token latency); an offline engine, or a server on a CPU, keeps the whole budget for
prompts."""

from __future__ import annotations

import pytest

from cadence.attention.base import BackendCapabilities
from cadence.config import (
    DEFAULT_MIXED_STEP_FACTOR,
    MIXED_GRAPH_TOKENS,
    EngineConfig,
    SchedulerConfig,
)
from cadence.worker.mixed_graphs import BUCKETS, captures_mixed_steps, mixed_step_tokens


def _filled(device: str, serving: bool, **kwargs) -> EngineConfig:
    config = EngineConfig.from_kwargs(model="unused", **kwargs)
    config.serving = serving
    config.validate()
    config.fill_defaults(device)
    return config


def test_a_server_on_a_gpu_bounds_prompt_tokens_beside_decodes_in_graphs():
    config = _filled("cuda", serving=True)
    sc = config.scheduler
    assert sc.max_prefill_tokens_while_decoding == 2048 - 256
    assert config.cuda_graph_prefill is True
    # a step of the bound's prompt tokens beside a full batch of decodes fits a graph
    assert mixed_step_tokens(sc, drafting=False) == MIXED_GRAPH_TOKENS == BUCKETS[-1]


@pytest.mark.parametrize("seqs, bound", [(512, 1536), (64, 1984), (1600, 512), (4096, 512)])
def test_the_served_bound_leaves_room_for_the_decodes(seqs, bound):
    """More sequences, fewer prompt tokens beside them; never fewer than 512."""
    config = _filled("cuda", serving=True, max_num_seqs=seqs)
    assert config.scheduler.max_prefill_tokens_while_decoding == bound


@pytest.mark.parametrize("device, serving", [("cuda", False), ("cpu", True), ("cpu", False)])
def test_offline_engines_and_cpu_servers_keep_the_whole_budget(device, serving):
    config = _filled(device, serving)
    assert config.scheduler.max_prefill_tokens_while_decoding == 0
    assert config.cuda_graph_prefill is False


@pytest.mark.parametrize("flags", [{"enforce_eager": True}, {"cuda_graph_prefill": False}])
def test_a_server_without_mixed_step_graphs_gets_no_bound(flags):
    """Eager mixed steps wait on their launches whatever their size: a bound alone buys
    nothing measurable there."""
    config = _filled("cuda", serving=True, **flags)
    assert config.scheduler.max_prefill_tokens_while_decoding == 0


def test_graphs_are_captured_only_where_the_backend_replays_them():
    """One rule for the runner (what it captures) and the memory profile (what it reserves)."""
    config = _filled("cuda", serving=True)
    both = BackendCapabilities(decode_graphs=True, mixed_graphs=True)
    assert captures_mixed_steps(config, both, drafting=False)
    for caps in (BackendCapabilities(decode_graphs=True), BackendCapabilities()):
        assert not captures_mixed_steps(config, caps, drafting=False)
        assert not captures_mixed_steps(config, caps, drafting=True)
    assert not captures_mixed_steps(_filled("cuda", serving=True, enforce_eager=True), both, False)
    offline = _filled("cuda", serving=False)
    assert not captures_mixed_steps(offline, both, drafting=False)
    assert captures_mixed_steps(offline, both, drafting=True)  # verify steps replay them


@pytest.mark.parametrize("serving", [True, False])
def test_what_the_user_set_is_kept(serving):
    config = _filled(
        "cuda", serving, max_prefill_tokens_while_decoding=2048, cuda_graph_prefill=False
    )
    assert config.scheduler.max_prefill_tokens_while_decoding == 2048
    assert config.cuda_graph_prefill is False
    off = _filled("cuda", serving, max_prefill_tokens_while_decoding=0, cuda_graph_prefill=True)
    assert off.scheduler.max_prefill_tokens_while_decoding == 0
    assert off.cuda_graph_prefill is True


def test_a_server_with_mixed_step_graphs_paces_its_prompt_tokens():
    """Where the static bound is on by default, so is the pacer (cadence/core/step_pacer.py);
    eager mixed steps would read their launches as the price of prompt tokens."""
    assert _filled("cuda", serving=True).scheduler.mixed_step_factor == DEFAULT_MIXED_STEP_FACTOR
    for device, serving, flags in [
        ("cuda", False, {}),
        ("cpu", True, {}),
        ("cuda", True, {"enforce_eager": True}),
        ("cuda", True, {"cuda_graph_prefill": False}),
    ]:
        assert _filled(device, serving, **flags).scheduler.mixed_step_factor == 0
    assert _filled("cpu", True, mixed_step_factor=3).scheduler.mixed_step_factor == 3
    assert _filled("cuda", True, mixed_step_factor=0).scheduler.mixed_step_factor == 0
    # a static bound the user set (0: none) is theirs: no pacing unless asked for too
    for bound in (0, 1024):
        own = _filled("cuda", True, max_prefill_tokens_while_decoding=bound).scheduler
        assert own.mixed_step_factor == 0 and own.max_prefill_tokens_while_decoding == bound
    for bad in (1.0, 0.5, -1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="mixed_step_factor"):
            _filled("cuda", True, mixed_step_factor=bad)


def test_serve_builds_a_serving_engine(monkeypatch):
    """`cadence serve` hands the engine a config marked as serving (no server started)."""
    import cadence.entrypoints.api_server as api_server
    import cadence.entrypoints.launcher as launcher
    from cadence.cli.main import main

    seen = []
    monkeypatch.setattr(api_server, "create_app", lambda config, options: seen.append(config))

    def serve(app, host, port, shutdown_timeout, socks) -> int:  # (no server started)
        for sock in socks:
            sock.close()
        return 0

    monkeypatch.setattr(launcher, "serve", serve)
    assert main(["serve", "--device", "cpu", "--api-server-count", "1", "--port", "0"]) == 0
    assert [c.serving for c in seen] == [True]


def test_the_flag_is_not_a_users_to_set(capsys):
    from cadence.cli.main import main

    with pytest.raises(SystemExit):
        main(["serve", "--serving"])
    assert "unrecognized arguments: --serving" in capsys.readouterr().err


def _scheduler(bound: int | None, budget: int = 8192, seqs: int = 256) -> SchedulerConfig:
    return SchedulerConfig(
        max_num_batched_tokens=budget, max_num_seqs=seqs, max_prefill_tokens_while_decoding=bound
    )


def test_graphs_hold_the_bound_plus_a_token_a_decode():
    """A bounded step has at most the bound's prompt tokens and one token per decode: a
    larger one has nobody decoding, and runs eagerly."""
    assert mixed_step_tokens(_scheduler(512), drafting=False) == 512 + 256
    assert mixed_step_tokens(_scheduler(512, seqs=512), drafting=False) == 1024
    assert mixed_step_tokens(_scheduler(512, budget=600), drafting=False) == 600


@pytest.mark.parametrize("bound", [0, None])
def test_without_a_bound_graphs_hold_the_budget(bound):
    assert mixed_step_tokens(_scheduler(bound), drafting=False) == 8192


def test_verify_steps_hold_the_budget():
    """Speculative verify steps carry 1 + k tokens a request: the bound does not cap them."""
    assert mixed_step_tokens(_scheduler(512), drafting=True) == 8192


def test_every_flag_of_a_wrapped_field_keeps_its_help(capsys):
    """A field whose long comment made the formatter wrap its default (`name: T = (`, then
    `value  # help`) still lends the flag that comment."""
    from cadence.cli.main import main

    with pytest.raises(SystemExit):
        main(["serve", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "what fits the largest mixed-step graph beside max_num_seqs decodes" in text
    assert "(auto: on when serving on a GPU)" in text
    assert "the deployment's secret (better: $CADENCE_KV_TRANSFER_SECRET)" in text
