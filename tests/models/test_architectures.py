"""Which architectures run, and the clear errors around them: an unsupported one names
itself and the supported list (which `cadence serve --help` shows too); a model whose
attention needs what its backend lacks is refused when built, naming both; on CUDA the
automatic choice picks a backend that can run it."""

from __future__ import annotations

import pytest
from model_helpers import ZOO, build_tiny

from cadence.attention.torch_ref import TorchAttentionBackend
from cadence.models.architectures import supported_architectures
from cadence.models.registry import resolve_model_class
from cadence.worker.backends import beyond_triton


def test_an_unsupported_architecture_names_itself_and_the_supported_ones():
    class Config:
        architectures = ["FalconMambaForCausalLM"]

    with pytest.raises(ValueError, match="FalconMambaForCausalLM") as err:
        resolve_model_class(Config)
    assert all(arch in str(err.value) for arch in supported_architectures())


def test_serve_help_lists_the_architectures():
    from cadence.cli.main import build_parser

    parser = build_parser()
    serve = parser._subparsers._group_actions[0].choices["serve"]
    text = serve.format_help()
    assert all(arch in text for arch in supported_architectures())


class NoExtrasBackend(TorchAttentionBackend):
    """A backend that declares neither sliding windows nor soft-caps (as Triton's today)."""

    name = "plain"
    capabilities = TorchAttentionBackend.capabilities.__class__()


@pytest.mark.parametrize(("kind", "what"), [("mistral-window", "sliding"), ("gemma2", "soft")])
def test_a_backend_without_the_capability_is_refused_at_build(kind, what):
    config, hf_cls = build_tiny(kind)
    config.architectures = [hf_cls.__name__]
    if kind == "gemma2":
        config.sliding_window = None  # the soft-cap alone
    cls = resolve_model_class(config)
    with pytest.raises(ValueError, match=f"{what}.*plain attention backend"):
        cls(config, NoExtrasBackend(), max_position=256)
    cls(config, TorchAttentionBackend(), max_position=256)  # the torch backend runs it


def test_a_window_as_long_as_the_context_is_no_window():
    config, _ = build_tiny("mistral-window")
    model = resolve_model_class(config)(config, NoExtrasBackend(), max_position=8)
    assert all(layer.window is None for layer in model.attention_layers())


@pytest.mark.parametrize(
    ("kind", "head_dim", "lack"),
    [
        ("gemma2", None, None),  # soft-caps and windows: the Triton kernels take them
        ("mistral-window", None, None),
        ("llama", 96, None),  # Phi-3's width: padded tiles
        ("llama", 512, "head dim of 512"),
        ("llama", 15, "head dim of 15"),
        ("deepseek-v2", None, None),  # a 32 + 16 latent: triton_mla's tiles
    ],
)
def test_what_the_triton_kernels_lack_is_read_from_the_config(kind, head_dim, lack):
    config, _ = build_tiny(kind)
    if head_dim:
        config.head_dim = head_dim
    found = beyond_triton(config)
    assert (found is None) if lack is None else (lack in found)


def test_a_latent_the_mla_kernel_cannot_tile_is_read_from_the_config():
    config, _ = build_tiny("deepseek-v3")
    config.qk_rope_head_dim = 8
    assert "latent of 32 + 8" in beyond_triton(config)


def test_every_zoo_family_resolves_from_its_transformers_config():
    for kind in ZOO:
        config, hf_cls = build_tiny(kind)
        config.architectures = [hf_cls.__name__]
        assert resolve_model_class(config).__name__.lower() == hf_cls.__name__.lower()
