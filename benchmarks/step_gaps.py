"""Each engine's step period under a load just run: the time from one step's start to the
next one's (what a running sequence waits between tokens, as the engine sees it), from the
step timeline (`/v1/engine/steps`; start the servers with a --step-timeline-size large
enough for the run). Given a router's URL, reads every replica it lists (prefill too).

    python benchmarks/step_gaps.py http://127.0.0.1:8500 [--last-s 60]
"""

from __future__ import annotations

import argparse

import httpx


def pct(xs: list[float], q: float) -> float:
    return sorted(xs)[min(len(xs) - 1, int(q * len(xs)))]


def engines(url: str) -> list[tuple[str, str]]:
    r = httpx.get(url + "/v1/router/replicas", timeout=10)
    if r.status_code != 200:
        return [("engine", url)]
    body = r.json()
    out = [("prefill", p["url"]) for p in body.get("prefill", [])]
    return out + [("replica" if not out else "decode", p["url"]) for p in body["replicas"]]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("urls", nargs="+")
    p.add_argument("--last-s", type=float, default=0, help="only steps of the last N seconds")
    args = p.parse_args()
    for url in args.urls:
        for role, engine in engines(url):
            steps = httpx.get(engine + "/v1/engine/steps", params={"limit": 100_000}, timeout=60)
            steps = steps.json()["steps"]
            if args.last_s:
                steps = [s for s in steps if s["start"] >= steps[-1]["start"] - args.last_s]
            if len(steps) < 2:
                print(f"{role} {engine}: {len(steps)} steps")
                continue
            gaps = [(b["start"] - a["start"]) * 1e3 for a, b in zip(steps, steps[1:])]
            busy = [(g, s) for g, s in zip(gaps, steps) if g < 1000]  # (idle gaps left out)
            g = [x for x, _ in busy]
            slow = sorted(busy, key=lambda x: -x[0])[: max(1, len(busy) // 100)]
            slow_prefill = sum(s["prefill_tokens"] for _, s in slow) / len(slow)
            print(
                f"{role} {engine}: {len(steps)} steps, period p50 {pct(g, 0.5):.2f} "
                f"p90 {pct(g, 0.9):.2f} p99 {pct(g, 0.99):.2f} max {max(g):.2f} ms; "
                f"slowest 1 %: {slow_prefill:.0f} prefill tokens a step on average"
            )


if __name__ == "__main__":
    main()
