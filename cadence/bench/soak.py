"""The soak side of `cadence bench serve`: clients that hang up, bodies the server must
refuse, a `/health` prober, and the server's resident memory read from /proc.

Counting rules (see `SoakTally`): a hang-up is a request this client cut on purpose; one
whose answer was complete before the cut counts as `hangups_late`, not as a hang-up. An
invalid body is answered correctly by a 4xx whose JSON is an OpenAI error object
(`{"error": {"message": str, "type": str, ...}}`); anything else, a 5xx included, is
a failure of that request, counted under its kind.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from cadence.bench.serve_client import chunk_text, sse_chunks
from cadence.bench.stats import percentile

if TYPE_CHECKING:
    import httpx

# What an invalid request gets wrong; each must be refused with a 4xx.
INVALID_KINDS = (
    "malformed_json",
    "not_an_object",
    "wrong_types",
    "negative_max_tokens",
    "unknown_model",
    "bad_temperature",
    "zero_n",
    "missing_input",
)


def invalid_body(kind: str, model: str, chat: bool) -> bytes:
    """The raw body of one invalid request of `kind` (one of INVALID_KINDS)."""
    if kind == "malformed_json":
        return b'{"model": "' + model.encode() + b'", "prompt": "cut off'
    if kind == "not_an_object":
        return b'["a", "list", "not", "an", "object"]'
    base: dict[str, Any] = {"model": model, "max_tokens": 8}
    if chat:
        base["messages"] = [{"role": "user", "content": "Say hi."}]
    else:
        base["prompt"] = "Say hi."
    if kind == "wrong_types":
        base["max_tokens"] = "eight"
        base["messages" if chat else "prompt"] = {"not": "text"}
    elif kind == "negative_max_tokens":
        base["max_tokens"] = -5
    elif kind == "unknown_model":
        base["model"] = "no-such-model-for-the-soak"
    elif kind == "bad_temperature":
        base["temperature"] = -1.0
    elif kind == "zero_n":
        base["n"] = 0
    elif kind == "missing_input":
        del base["messages" if chat else "prompt"]
    else:
        raise ValueError(f"unknown invalid kind {kind!r}")
    return json.dumps(base).encode()


def is_error_object(raw: bytes) -> bool:
    """Whether a body is an OpenAI error object: {"error": {"message": str, "type": str}}."""
    try:
        body = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError):
        return False
    err = body.get("error") if isinstance(body, dict) else None
    return (
        isinstance(err, dict)
        and isinstance(err.get("message"), str)
        and isinstance(err.get("type"), str)
    )


@dataclass
class SoakTally:
    """Counts over one run, by request kind (normal requests are `RequestRecord`s)."""

    sent: Counter = field(default_factory=Counter)  # "normal" / "hangup" / "invalid" -> n
    hangups: int = 0  # cut by this client mid-answer
    hangups_late: int = 0  # the answer was complete before the cut was due
    invalid_ok: int = 0  # a 4xx with an error object
    invalid_failed: int = 0
    invalid_statuses: Counter = field(default_factory=Counter)  # "400" -> n
    errors: Counter = field(default_factory=Counter)  # hang-up / invalid failures by kind

    def to_json(self) -> dict[str, Any]:
        return {
            "sent": dict(self.sent),
            "hangups": self.hangups,
            "hangups_late": self.hangups_late,
            "invalid_ok": self.invalid_ok,
            "invalid_failed": self.invalid_failed,
            "invalid_statuses": dict(sorted(self.invalid_statuses.items())),
            "errors": dict(self.errors),
        }


async def send_invalid(
    client: httpx.AsyncClient, path: str, kind: str, model: str, chat: bool, tally: SoakTally
) -> None:
    import httpx

    try:
        resp = await client.post(
            path,
            content=invalid_body(kind, model, chat),
            headers={"content-type": "application/json"},
        )
    except httpx.HTTPError as e:
        tally.invalid_failed += 1
        tally.errors[f"invalid: {type(e).__name__}"] += 1
        return
    tally.invalid_statuses[str(resp.status_code)] += 1
    if 400 <= resp.status_code < 500 and is_error_object(resp.content):
        tally.invalid_ok += 1
        return
    tally.invalid_failed += 1
    if 400 <= resp.status_code < 500:
        tally.errors[f"invalid {kind}: HTTP {resp.status_code} without an error object"] += 1
    else:
        tally.errors[f"invalid {kind}: HTTP {resp.status_code}"] += 1


async def send_hangup(
    client: httpx.AsyncClient,
    path: str,
    body: dict,
    chat: bool,
    stream: bool,
    cut: float,
    tally: SoakTally,
) -> None:
    """Send `body` and walk away: streamed, after `int(cut)` text chunks (1 or 2); not
    streamed, after `cut` seconds. Leaving the `async with` (or cancelling the post)
    closes the connection, which is what a hang-up looks like to the server."""
    import httpx

    try:
        if stream:
            seen = 0
            async with client.stream("POST", path, json=body) as resp:
                if resp.status_code != 200:
                    await resp.aread()
                    tally.errors[f"hangup: HTTP {resp.status_code}"] += 1
                    return
                async for chunk in sse_chunks(resp):
                    if chunk is None:
                        break
                    if chunk_text(chunk, chat):
                        seen += 1
                        if seen >= int(cut):
                            tally.hangups += 1
                            return  # closes the connection mid-stream
            tally.hangups_late += 1
        else:
            plain = {k: v for k, v in body.items() if k not in ("stream", "stream_options")}
            plain["stream"] = False
            try:
                resp = await asyncio.wait_for(client.post(path, json=plain), cut)
            except TimeoutError:
                tally.hangups += 1
                return
            if resp.status_code != 200:
                tally.errors[f"hangup: HTTP {resp.status_code}"] += 1
            else:
                tally.hangups_late += 1
    except httpx.HTTPError as e:
        tally.errors[f"hangup: {type(e).__name__}"] += 1
    except json.JSONDecodeError:
        tally.errors["hangup: bad JSON in the stream"] += 1


# ---- /health ----------------------------------------------------------------------------


class HealthProber:
    """One GET /health every `interval` seconds, on its own connection pool, so it sees
    what a load balancer would. A probe that fails to answer counts as non-200."""

    def __init__(self, base_url: str, interval: float, timeout: float = 10.0) -> None:
        self.base_url = base_url
        self.interval = interval
        self.timeout = timeout
        self.latencies: list[float] = []  # seconds, every probe that got an answer
        self.non_200: Counter = Counter()  # "503" or an exception's class -> n

    async def run(self, stop: asyncio.Event) -> None:
        import httpx

        async with httpx.AsyncClient(base_url=self.base_url, timeout=self.timeout) as client:
            next_at = time.perf_counter()
            while not stop.is_set():
                t = time.perf_counter()
                try:
                    resp = await client.get("/health")
                    self.latencies.append(time.perf_counter() - t)
                    if resp.status_code != 200:
                        self.non_200[str(resp.status_code)] += 1
                except httpx.HTTPError as e:
                    self.non_200[type(e).__name__] += 1
                next_at += self.interval
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), max(0.0, next_at - time.perf_counter()))

    def summary(self) -> dict[str, Any]:
        ms = [x * 1e3 for x in self.latencies]
        return {
            "probes": len(ms) + sum(v for k, v in self.non_200.items() if not k.isdigit()),
            "non_200": sum(self.non_200.values()),
            "non_200_by_kind": dict(self.non_200),
            "p50_ms": percentile(ms, 50),
            "p99_ms": percentile(ms, 99),
            "max_ms": max(ms) if ms else None,
        }


# ---- resident memory ------------------------------------------------------------------


def process_tree(pid: int) -> list[int]:
    """`pid` and its descendants (the API server and its engine), from /proc."""
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(name))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(children.get(p, []))
    return out


def rss_mb(pid: int) -> float | None:
    """Resident set size in MiB (VmRSS), or None if the process is gone."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def process_name(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmd = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return "?"
    return cmd[:80]


def rss_sample(pid: int) -> dict[str, Any]:
    """{"total_mb": the tree's RSS, "processes": {pid: MiB}}; a process that ends while
    being read counts 0."""
    procs = {p: rss_mb(p) for p in process_tree(pid)}
    procs = {p: v for p, v in procs.items() if v is not None}
    return {"total_mb": sum(procs.values()), "processes": {str(p): v for p, v in procs.items()}}


class RssSampler:
    """The RSS of a process tree at the start, every `interval` seconds, and at the end."""

    def __init__(self, pid: int, interval: float) -> None:
        self.pid = pid
        self.interval = interval
        self.samples: list[dict[str, Any]] = []
        self.names: dict[str, str] = {}
        self._t0 = time.perf_counter()

    def sample(self) -> None:
        s = rss_sample(self.pid)
        s["t_s"] = time.perf_counter() - self._t0
        for p in s["processes"]:
            if p not in self.names:
                self.names[p] = process_name(int(p))
        self.samples.append(s)

    async def run(self, stop: asyncio.Event) -> None:
        self._t0 = time.perf_counter()
        self.sample()
        while True:
            try:
                await asyncio.wait_for(stop.wait(), self.interval)
                break
            except TimeoutError:
                self.sample()
        self.sample()

    def summary(self) -> dict[str, Any]:
        totals = [s["total_mb"] for s in self.samples]
        return {
            "pid": self.pid,
            "start_mb": totals[0] if totals else None,
            "end_mb": totals[-1] if totals else None,
            "max_mb": max(totals) if totals else None,
            "names": self.names,
            "samples": self.samples,
        }


def format_soak(soak: dict[str, Any]) -> str:
    """The soak block printed after a run's table."""

    def ms(v: float | None) -> str:
        return "-" if v is None else f"{v:.1f}"

    t = soak["tally"]
    lines = ["---------------- soak ----------------"]
    sent = ", ".join(f"{k} {v}" for k, v in sorted(t["sent"].items()))
    lines.append(f"requests sent:           {sum(t['sent'].values())} ({sent})")
    lines.append(f"normal requests done:    {soak['completed']} (failed {soak['failed']})")
    lines.append(f"hang-ups:                {t['hangups']} (answered before the cut: "
                 f"{t['hangups_late']})")  # fmt: skip
    lines.append(f"invalid answered right:  {t['invalid_ok']} of {t['sent'].get('invalid', 0)} "
                 f"(statuses: {t['invalid_statuses']})")  # fmt: skip
    errors = soak["errors_by_kind"]
    lines.append("errors by kind:          " + (", ".join(f"{k}: {v}" for k, v in errors.items())
                                                 or "none"))  # fmt: skip
    h = soak["health"]
    lines.append(f"/health:                 {h['probes']} probes, p50 {ms(h['p50_ms'])} ms, "
                 f"p99 {ms(h['p99_ms'])} ms, max {ms(h['max_ms'])} ms, non-200 {h['non_200']}")  # fmt: skip
    rss = soak.get("rss")
    if rss and rss["samples"]:
        first, last = rss["samples"][0], rss["samples"][-1]
        lines.append(f"server RSS (MiB):        start {rss['start_mb']:.0f}, end "
                     f"{rss['end_mb']:.0f}, max {rss['max_mb']:.0f}")  # fmt: skip
        for p, name in rss["names"].items():
            a, b = first["processes"].get(p), last["processes"].get(p)
            lines.append(f"  pid {p}: {'-' if a is None else f'{a:.0f}'} -> "
                         f"{'-' if b is None else f'{b:.0f}'}  {name}")  # fmt: skip
    return "\n".join(lines)
