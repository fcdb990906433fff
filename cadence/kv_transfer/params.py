"""`kv_transfer_params`: what a request asks of disaggregated serving (no torch here: the
scheduler reads it; the connectors live in connector.py)."""

from __future__ import annotations

PREFILL, DECODE = "prefill", "decode"


def wants_remote_decode(params: dict | None) -> bool:
    return bool(params and params.get("do_remote_decode") and params.get("transfer_id"))


def wants_remote_prefill(params: dict | None) -> bool:
    return bool(
        params
        and params.get("do_remote_prefill")
        and params.get("transfer_id")
        and params.get("remote_addr")
    )


def check_kv_transfer_params(params: dict | None) -> None:
    """Raise ValueError for a malformed `kv_transfer_params`."""
    if params is None:
        return
    if not isinstance(params, dict):
        raise ValueError("kv_transfer_params must be an object")
    for key in ("transfer_id", "remote_addr"):
        if key in params and not isinstance(params[key], str):
            raise ValueError(f"kv_transfer_params.{key} must be a string")
