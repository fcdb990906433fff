"""The disaggregated-serving flags: a bad role, connector, secret or combination is a usage
error that names the problem (exit 2), before any model loads."""

from __future__ import annotations

import argparse

import pytest

from cadence.engine_args import add_engine_args, check_engine_args


def parse(argv: list[str]) -> dict:
    parser = argparse.ArgumentParser()
    add_engine_args(parser)
    return check_engine_args(parser, parser.parse_args(["m", *argv]))


@pytest.fixture
def secret(monkeypatch):
    monkeypatch.setenv("CADENCE_KV_TRANSFER_SECRET", "a-deployment-secret-0123")


def test_roles_and_connectors(secret):
    kw = parse(["--kv-role", "decode", "--kv-connector", "cuda_ipc", "--device", "cuda"])
    assert (kw["kv_role"], kw["kv_connector"]) == ("decode", "cuda_ipc")
    kw = parse(["--kv-role", "prefill", "--kv-connector", "shm", "--kv-transfer-port", "7100"])
    assert (kw["kv_connector"], kw["kv_transfer_port"]) == ("shm", 7100)


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--kv-role", "both"], "kv_role must be prefill or decode"),
        (["--kv-role", "prefill", "--kv-transfer-secret", ""], "deployment's secret"),
        (["--kv-connector", "rdma"], "kv_connector must be tcp, shm or cuda_ipc"),
        (["--kv-connector", "cuda_ipc", "--device", "cpu"], "cuda_ipc needs a GPU"),
        (["--kv-role", "decode", "-tp", "2"], "tensor_parallel_size 1"),
        # the secret: absent, or too short to be one
        (["--kv-role", "decode", "--kv-transfer-secret", "short"], "16 characters or more"),
        (["--kv-prefill-addrs", "tcp://h:1;rm -rf /"], "kv-prefill-addrs"),
    ],
)
def test_bad_combinations_are_usage_errors(argv, message, capsys, secret):
    with pytest.raises(SystemExit) as e:
        parse(argv)
    assert e.value.code == 2
    assert message in capsys.readouterr().err
