"""`kv_transfer_params`: what a request asks of disaggregated serving, and who may ask it
(no torch here: the scheduler and the API server read it; the connectors live in
connector.py).

    prefill side   {"do_remote_decode": true, "transfer_id": T}
    decode side    {"do_remote_prefill": true, "remote_addr": "tcp://host:port", "transfer_id": T}

Over HTTP the field is internal to a deployment: the router signs what it sends with the
deployment's secret (`sign`), and an engine's API server takes the field only with a valid,
fresh, unused signature (`TransferAuthority`). A client cannot make a decode engine load
K/V from an address of its choosing (and cache it under its own prompt), nor make a
prefill engine stage K/V under an id of its choosing. The engine core checks the shape of
the values (transfer ids name files and map entries; addresses are connected to).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
import threading
import time
from collections import OrderedDict

from cadence.config import KV_ADDR

PREFILL, DECODE = "prefill", "decode"

TRANSFER_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
SIGNED_FIELDS = ("do_remote_decode", "do_remote_prefill", "transfer_id", "remote_addr", "issued_at")
MAX_AGE_S = 120.0  # a signature older (or newer) than this is refused: hosts' clocks agree


def wants_remote_decode(params: dict | None) -> bool:
    return bool(params and params.get("do_remote_decode") and params.get("transfer_id"))


def wants_remote_prefill(params: dict | None) -> bool:
    return bool(
        params
        and params.get("do_remote_prefill")
        and params.get("transfer_id")
        and params.get("remote_addr")
    )


def check_transfer_id(tid) -> str:
    """`tid` if it is a transfer id (letters, digits, `.`, `_`, `-`; up to 128 of them);
    ValueError otherwise. Ids end up in map keys and log lines, never in paths."""
    if not isinstance(tid, str) or TRANSFER_ID.fullmatch(tid) is None:
        raise ValueError(
            "kv_transfer_params.transfer_id must be 1-128 letters, digits, '.', '_' or '-' "
            "(starting with a letter or digit)"
        )
    return tid


def check_kv_transfer_params(params: dict | None, allowed_addrs: frozenset[str] | None = None):
    """Raise ValueError for a malformed `kv_transfer_params`, or a `remote_addr` that is not
    one of `allowed_addrs` (the decode engine's --kv-prefill-addrs, when given)."""
    if params is None:
        return
    if not isinstance(params, dict):
        raise ValueError("kv_transfer_params must be an object")
    if "transfer_id" in params:
        check_transfer_id(params["transfer_id"])
    if "remote_addr" in params:
        addr = params["remote_addr"]
        if not isinstance(addr, str) or KV_ADDR.fullmatch(addr) is None:
            raise ValueError("kv_transfer_params.remote_addr must be tcp://HOST:PORT")
        if allowed_addrs is not None and addr not in allowed_addrs:
            raise ValueError(
                f"kv_transfer_params.remote_addr {addr} is not one of this engine's prefill "
                "engines (--kv-prefill-addrs)"
            )


def prefill_addrs(text: str | None) -> frozenset[str] | None:
    """--kv-prefill-addrs ("tcp://h:p,tcp://h:p") -> the set; None when not given."""
    if not text:
        return None
    addrs = frozenset(a.strip() for a in text.split(",") if a.strip())
    for addr in addrs:
        check_kv_transfer_params({"remote_addr": addr})
    return addrs


def _mac(secret: str, params: dict) -> str:
    key = hashlib.sha256(f"cadence-kv-params\0{secret}".encode()).digest()
    signed = {k: params[k] for k in SIGNED_FIELDS if k in params}
    text = json.dumps(signed, sort_keys=True, separators=(",", ":"))
    return hmac.new(key, text.encode(), hashlib.sha256).hexdigest()


def sign(params: dict, secret: str, now: float | None = None) -> dict:
    """`params` as the router sends them: stamped and signed with the deployment's secret."""
    out = {**params, "issued_at": time.time() if now is None else now}
    out["signature"] = _mac(secret, out)
    return out


class TransferAuthority:
    """The API server's check of a client's `kv_transfer_params` (one per server)."""

    def __init__(self, secret: str | None, max_age_s: float = MAX_AGE_S) -> None:
        self.secret = secret
        self.max_age_s = max_age_s
        self._seen: OrderedDict[str, float] = OrderedDict()  # transfer id -> when it came
        self._lock = threading.Lock()

    def verify(self, params, now: float | None = None) -> dict:
        """The params to run (without the signature); PermissionError naming why not."""
        if self.secret is None:
            raise PermissionError(
                "kv_transfer_params is internal to a disaggregated deployment: this server "
                "takes it from nobody (it has no --kv-transfer-secret)"
            )
        if not isinstance(params, dict):
            raise PermissionError("kv_transfer_params must be an object")
        signature = params.get("signature")
        if not isinstance(signature, str) or not hmac.compare_digest(
            signature, _mac(self.secret, params)
        ):
            raise PermissionError(
                "kv_transfer_params is internal to a disaggregated deployment: it needs the "
                "router's signature"
            )
        now = time.time() if now is None else now
        issued = params.get("issued_at")
        if not isinstance(issued, (int, float)) or abs(now - issued) > self.max_age_s:
            raise PermissionError("kv_transfer_params: the signature has expired")
        tid = check_transfer_id(params.get("transfer_id"))
        with self._lock:
            while self._seen and next(iter(self._seen.values())) < now - 2 * self.max_age_s:
                self._seen.popitem(last=False)
            if tid in self._seen:
                raise PermissionError(f"kv_transfer_params: transfer {tid!r} was used already")
            self._seen[tid] = now
        return {k: v for k, v in params.items() if k not in ("signature", "issued_at")}
