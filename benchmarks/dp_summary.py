"""One line per `cadence bench serve` result (+ its .hits.json): throughput, TTFT/ITL p99,
prefix hit rate. `python benchmarks/dp_summary.py DIR NAME...` (it also drops the
per-request records from each result file: the summaries are what we keep)."""

from __future__ import annotations

import json
import os
import sys


def main() -> None:
    folder, names = sys.argv[1], sys.argv[2:]
    for name in names:
        path = os.path.join(folder, name + ".json")
        with open(path) as f:
            result = json.load(f)
        for r in result.get("runs", []):
            r.pop("requests", None)
        with open(path, "w") as f:
            json.dump(result, f, indent=1)
        run = result["runs"][0]
        s = run.get("summary", run)
        hits_path = os.path.join(folder, name + ".hits.json")
        hit = None
        if os.path.exists(hits_path):
            with open(hits_path) as f:
                hit = json.load(f)["hit_rate"]
        print(
            f"{name:<24} req/s {s['request_throughput']:7.2f}  out tok/s {s['output_throughput']:8.1f}"
            f"  TTFT p99 {s['p99_ttft_ms']:8.1f} ms  ITL p99 {s['p99_itl_ms']:7.1f} ms"
            + (f"  hit rate {100 * hit:5.1f} %" if hit is not None else "")
        )


if __name__ == "__main__":
    main()
