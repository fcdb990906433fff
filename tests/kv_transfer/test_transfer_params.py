"""Who may send kv_transfer_params (kv_transfer/params.py): the router signs them with the
deployment's secret; an API server takes only a valid, fresh, unused signature; the engine
core checks the values' shape and, when configured, the prefill engine's address."""

from __future__ import annotations

import pytest

from cadence.kv_transfer.params import (
    TransferAuthority,
    check_kv_transfer_params,
    prefill_addrs,
    sign,
)

SECRET = "deployment-secret-0123456789"
PARAMS = {"do_remote_prefill": True, "remote_addr": "tcp://10.0.0.5:7100", "transfer_id": "abc"}


def test_a_signed_request_passes_once():
    auth = TransferAuthority(SECRET)
    signed = sign(PARAMS, SECRET, now=1000.0)
    assert auth.verify(signed, now=1010.0) == PARAMS  # (signature and stamp stripped)
    with pytest.raises(PermissionError, match="used already"):
        auth.verify(signed, now=1011.0)


@pytest.mark.parametrize(
    "change",
    [
        {"remote_addr": "tcp://attacker:7100"},
        {"transfer_id": "other"},
        {"do_remote_prefill": False},
        {"issued_at": 1005.0},
        {"signature": "0" * 64},
        {"signature": None},
    ],
)
def test_any_change_to_a_signed_field_breaks_it(change):
    signed = {**sign(PARAMS, SECRET, now=1000.0), **change}
    with pytest.raises(PermissionError):
        TransferAuthority(SECRET).verify(signed, now=1000.0)


def test_no_secret_takes_nothing_and_a_stale_signature_is_refused():
    with pytest.raises(PermissionError, match="takes it from nobody"):
        TransferAuthority(None).verify(sign(PARAMS, SECRET))
    with pytest.raises(PermissionError, match="signature"):
        TransferAuthority(SECRET).verify(sign(PARAMS, "another-deployment-secret"))
    with pytest.raises(PermissionError, match="expired"):
        TransferAuthority(SECRET).verify(sign(PARAMS, SECRET, now=1000.0), now=1200.0)


@pytest.mark.parametrize("tid", ["a/b", "../x", "", " a", "a" * 129, 5, None])
def test_transfer_ids_are_ids(tid):
    with pytest.raises(ValueError, match="transfer_id"):
        check_kv_transfer_params({**PARAMS, "transfer_id": tid})
    with pytest.raises(ValueError, match="transfer_id"):
        TransferAuthority(SECRET).verify(sign({**PARAMS, "transfer_id": tid}, SECRET))


def test_remote_addresses_are_addresses_and_can_be_pinned():
    for addr in ("http://x:1", "tcp://x", "tcp://x:1/../", "ipc:///tmp/s", 7):
        with pytest.raises(ValueError, match="remote_addr"):
            check_kv_transfer_params({**PARAMS, "remote_addr": addr})
    allowed = prefill_addrs("tcp://10.0.0.5:7100, tcp://[::1]:7100")
    check_kv_transfer_params(PARAMS, allowed)
    with pytest.raises(ValueError, match="not one of this engine's prefill engines"):
        check_kv_transfer_params({**PARAMS, "remote_addr": "tcp://10.0.0.6:7100"}, allowed)
    assert prefill_addrs(None) is None
