"""The LoRA flags, as vLLM spells them: their values reach the engine's config, and a bad
value or combination is a usage error naming it (exit 2), before any model loads."""

from __future__ import annotations

import argparse

import pytest

from cadence.config import EngineConfig
from cadence.engine_args import add_engine_args, check_engine_args
from cadence.entrypoints.lora_adapters import LoRAModule


def parse(argv: list[str]) -> dict:
    parser = argparse.ArgumentParser()
    add_engine_args(parser)
    return check_engine_args(parser, parser.parse_args(["m", *argv]))


def test_flags_reach_the_config():
    kw = parse(["--enable-lora", "--max-loras", "8", "--max-lora-rank", "64"])
    lora = EngineConfig.from_kwargs(**kw).lora
    assert (lora.enable_lora, lora.max_loras, lora.max_lora_rank) == (True, 8, 64)
    assert lora.max_cpu_loras == 8  # default: as many as the slots
    assert not EngineConfig.from_kwargs().lora.enable_lora


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--enable-lora", "--max-loras", "0"], "max_loras must be positive"),
        (["--enable-lora", "--max-lora-rank", "0"], "max_lora_rank must be in"),
        (["--max-loras", "4", "--max-cpu-loras", "2"], "must be at least max_loras"),
        (["--enable-lora", "--prefix-cache", "radix"], "hash prefix cache"),
        (["--enable-lora", "--speculative-config", '{"method": "ngram", "num_speculative_tokens": 2}'], "speculative"),
    ],
)  # fmt: skip
def test_bad_values_are_usage_errors(argv, message, capsys):
    with pytest.raises(SystemExit) as e:
        parse(argv)
    assert e.value.code == 2
    assert message in capsys.readouterr().err


def test_lora_modules_entries():
    assert LoRAModule.parse("sql=/a/b") == LoRAModule("sql", "/a/b")
    assert LoRAModule.parse('{"name": "x", "path": "/p", "base_model_name": "org/m"}') == (
        LoRAModule("x", "/p", "org/m")
    )
    for bad in ("sql", "=/a", "sql=", '{"name": "x"}', "{nope"):
        with pytest.raises(ValueError, match="--lora-modules"):
            LoRAModule.parse(bad)


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--lora-modules", "sql=/a"], "--lora-modules needs --enable-lora"),
        (["--enable-lora", "--lora-modules", "sql"], "is not NAME=PATH"),
    ],
)
def test_serve_refuses_bad_lora_modules(argv, message, capsys):
    from cadence.cli.main import main

    with pytest.raises(SystemExit) as e:
        main(["serve", *argv])
    assert e.value.code == 2
    assert message in capsys.readouterr().err
