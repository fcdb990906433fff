"""The tensor-parallel flags, spelled as vLLM users know them."""

from __future__ import annotations

import pytest


def test_tensor_parallel_flags():
    import argparse

    from cadence.engine_args import add_engine_args, check_engine_args

    parser = argparse.ArgumentParser()
    add_engine_args(parser)
    args = parser.parse_args(["m", "-tp", "2", "--distributed-executor-backend", "ray"])
    kwargs = check_engine_args(parser, args)
    assert kwargs["tensor_parallel_size"] == 2
    assert kwargs["distributed_executor_backend"] == "ray"
    long = parser.parse_args(["--tensor-parallel-size", "4", "--disable-custom-all-reduce"])
    assert check_engine_args(parser, long)["disable_custom_all_reduce"] is True
    with pytest.raises(SystemExit):
        check_engine_args(parser, parser.parse_args(["--distributed-executor-backend", "mpi"]))
