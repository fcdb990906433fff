"""Prefix-cache hit rate of a server, or of every replica behind a Cadence router, from
their own /metrics: `python benchmarks/dp_hit_rate.py URL [--json PATH]`."""

from __future__ import annotations

import argparse
import json

import httpx


def counter(url: str, name: str) -> float:
    total = 0.0
    for line in httpx.get(url + "/metrics", timeout=10).text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            total += float(line.rsplit(" ", 1)[1])
    return total


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("url")
    ap.add_argument("--json", metavar="PATH")
    args = ap.parse_args()
    status = httpx.get(args.url + "/v1/router/replicas", timeout=10)
    urls = (
        [r["url"] for r in status.json()["replicas"]] if status.status_code == 200 else [args.url]
    )
    rows = []
    for u in urls:
        hits = counter(u, "cadence:prefix_cache_hits_total")
        queries = counter(u, "cadence:prefix_cache_queries_total")
        requests = counter(u, "cadence:request_success_total")
        rows.append({"url": u, "hits": hits, "queries": queries, "requests": requests})
    hits, queries = sum(r["hits"] for r in rows), sum(r["queries"] for r in rows)
    result = {"replicas": rows, "hit_rate": hits / queries if queries else 0.0}
    if status.status_code == 200:
        result["router_estimated_hit_rate"] = counter(
            args.url, "cadence:router_estimated_hit_tokens_total"
        ) / max(1.0, counter(args.url, "cadence:router_prompt_tokens_total"))
    print(json.dumps(result))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
