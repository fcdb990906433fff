"""What `cadence bench serve` shows and writes: the terminal table, the JSON file, a
scoreboard row (markdown), and plots (matplotlib).

A result (`dict`) holds the run's context (command, commit, server version, date, model,
workload) and `runs`, one entry per concurrency: {"max_concurrency", "request_rate",
"summary" (stats.summarize), "token_check", "requests" (per-request records)}.
Latencies in summaries are milliseconds; per-request times are seconds (`_s` keys).
"""

from __future__ import annotations

import math
import os
from typing import Any

from cadence.bench.offline import write_json
from cadence.bench.stats import percentile

RULE_WIDTH = 50


def _fmt(value: Any, digits: int = 2) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        if math.isinf(value):
            return "inf"
        return f"{value:.{digits}f}"
    return str(value)


def _rate(run: dict[str, Any]) -> str:
    """The request rate; null in the JSON means unlimited (all requests at once)."""
    rate = run.get("request_rate")
    return "inf" if rate is None else _fmt(rate)


def _concurrency(run: dict[str, Any]) -> str:
    c = run.get("max_concurrency")
    return "unlimited" if c is None else str(c)


# ---- terminal -------------------------------------------------------------------------


def format_run(run: dict[str, Any]) -> str:
    """vLLM's result block for one run."""
    s = run["summary"]
    lines = [f"{' Serving Benchmark Result ':=^{RULE_WIDTH}}"]

    def row(name: str, value: Any, digits: int = 2) -> None:
        lines.append(f"{name:<40} {_fmt(value, digits):<10}")

    row("Successful requests:", s["completed"])
    if s["failed"]:
        row("Failed requests:", s["failed"])
    row("Maximum request concurrency:", _concurrency(run))
    row("Request rate (req/s):", _rate(run))
    row("Benchmark duration (s):", s["duration"])
    row("Total input tokens:", s["total_input_tokens"])
    row("Total generated tokens:", s["total_output_tokens"])
    row("Request throughput (req/s):", s["request_throughput"])
    if s.get("request_goodput") is not None:
        row("Request goodput (req/s):", s["request_goodput"])
    row("Output token throughput (tok/s):", s["output_throughput"])
    row("Total token throughput (tok/s):", s["total_token_throughput"])
    sections = (
        ("ttft", "Time to First Token", "TTFT"),
        ("tpot", "Time per Output Token (excl. 1st token)", "TPOT"),
        ("itl", "Inter-token Latency", "ITL"),
        ("e2el", "End-to-end Latency", "E2EL"),
    )
    for key, title, short in sections:
        lines.append(f"{' ' + title + ' ':-^{RULE_WIDTH}}")
        row(f"Mean {short} (ms):", s[f"mean_{key}_ms"])
        row(f"Median {short} (ms):", s[f"median_{key}_ms"])
        row(f"P90 {short} (ms):", s[f"p90_{key}_ms"])
        row(f"P99 {short} (ms):", s[f"p99_{key}_ms"])
    spec = run.get("spec_decode")
    if spec is not None:  # the server's counters over this run (cadence/bench/spec_metrics.py)
        lines.append(f"{' Speculative Decoding ':-^{RULE_WIDTH}}")
        row("Acceptance rate (%):", 100 * spec["acceptance_rate"])
        row("Acceptance length:", spec["acceptance_length"])
        row("Drafts:", spec["drafts"])
        row("Draft tokens:", spec["draft_tokens"])
        row("Accepted tokens:", spec["accepted_tokens"])
        if spec["acceptance_rate_per_position"]:
            per_pos = ", ".join(f"{100 * r:.1f}" for r in spec["acceptance_rate_per_position"])
            lines.append(f"{'Per-position acceptance (%):':<40} {per_pos}")
    lines.append("=" * RULE_WIDTH)
    return "\n".join(lines)


SWEEP_COLUMNS = (
    ("concurrency", None),
    ("req/s", "request_throughput"),
    ("out tok/s", "output_throughput"),
    ("TTFT p50", "median_ttft_ms"),
    ("TTFT p99", "p99_ttft_ms"),
    ("TPOT p50", "median_tpot_ms"),
    ("TPOT p99", "p99_tpot_ms"),
    ("ITL p50", "median_itl_ms"),
    ("E2E p50", "median_e2el_ms"),
    ("E2E p99", "p99_e2el_ms"),
    ("failed", "failed"),
)


def format_sweep(runs: list[dict[str, Any]]) -> str:
    """One line per run (latencies in ms)."""
    header = [name for name, _ in SWEEP_COLUMNS]
    rows = []
    for run in runs:
        s = run["summary"]
        rows.append([_concurrency(run)] + [_fmt(s[k], 1) for _, k in SWEEP_COLUMNS[1:]])
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]
    lines = ["  ".join(h.rjust(w) for h, w in zip(header, widths))]
    lines += ["  ".join(c.rjust(w) for c, w in zip(r, widths)) for r in rows]
    return "Sweep (latencies in ms)\n" + "\n".join(lines)


# ---- JSON -----------------------------------------------------------------------------


def save_json(path: str, result: dict[str, Any]) -> None:
    """The whole result: context, every run's summary and every request's record."""
    write_json(path, result)


# ---- scoreboard -----------------------------------------------------------------------

SCOREBOARD_COLUMNS = (
    "date",
    "label",
    "model",
    "endpoint",
    "dataset",
    "prompts",
    "concurrency",
    "rate (req/s)",
    "req/s",
    "out tok/s",
    "TTFT p50 (ms)",
    "TTFT p99 (ms)",
    "TPOT p50 (ms)",
    "TPOT p99 (ms)",
    "ITL p50 (ms)",
    "E2E p50 (ms)",
    "E2E p99 (ms)",
    "goodput (req/s)",
    "failed",
    "commit",
)


def _cell(value: Any) -> str:
    return str(value).replace("|", "\\|").replace("\n", " ")


def scoreboard_row(result: dict[str, Any], run: dict[str, Any], label: str) -> str:
    """The markdown row of one run."""
    s = run["summary"]
    commit = result.get("git_commit") or "-"
    if result.get("git_dirty"):
        commit += "+"
    cells = [
        result["date"],
        label,
        result["model"],
        result["endpoint"],
        result["dataset"]["name"],
        s["completed"] + s["failed"],
        _concurrency(run),
        _rate(run),
        _fmt(s["request_throughput"]),
        _fmt(s["output_throughput"], 1),
        _fmt(s["median_ttft_ms"], 1),
        _fmt(s["p99_ttft_ms"], 1),
        _fmt(s["median_tpot_ms"], 1),
        _fmt(s["p99_tpot_ms"], 1),
        _fmt(s["median_itl_ms"], 1),
        _fmt(s["median_e2el_ms"], 1),
        _fmt(s["p99_e2el_ms"], 1),
        _fmt(s.get("request_goodput")),
        s["failed"],
        commit[:13],
    ]
    return "| " + " | ".join(_cell(c) for c in cells) + " |"


def scoreboard_header() -> str:
    top = "| " + " | ".join(SCOREBOARD_COLUMNS) + " |"
    rule = "|" + "|".join("---" for _ in SCOREBOARD_COLUMNS) + "|"
    return top + "\n" + rule


def append_scoreboard(path: str, result: dict[str, Any], label: str) -> None:
    """Append one row per run; write the table header first if the file lacks it."""
    header = scoreboard_header()
    existing = ""
    if os.path.exists(path):
        with open(path) as f:
            existing = f.read()
    chunks = []
    if header.splitlines()[0] not in existing:
        if existing and not existing.endswith("\n\n"):
            chunks.append("\n" if existing.endswith("\n") else "\n\n")
        chunks.append(header + "\n")
    elif existing and not existing.endswith("\n"):
        chunks.append("\n")
    chunks += [scoreboard_row(result, run, label) + "\n" for run in result["runs"]]
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    with open(path, "a") as f:
        f.write("".join(chunks))


# ---- plots ----------------------------------------------------------------------------


def check_matplotlib() -> None:
    """Raise a clear error now, not after the run, if --plot cannot work."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise ValueError("--plot needs matplotlib: pip install matplotlib") from None


def plot(path: str, result: dict[str, Any]) -> None:
    """A sweep (several concurrencies): throughput and TTFT / TPOT p50 and p99 against
    concurrency. One run: the distributions of TTFT and ITL."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = result["runs"]
    fig = _plot_sweep(plt, runs) if len(runs) > 1 else _plot_distributions(plt, runs[0])
    fig.suptitle(f"{result['model']} - {result['endpoint']} - {result['dataset']['name']}")
    fig.tight_layout()
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _plot_sweep(plt, runs: list[dict[str, Any]]):
    xs = [r["max_concurrency"] or r["summary"]["completed"] for r in runs]
    fig, (ax_tp, ax_ttft, ax_tpot) = plt.subplots(1, 3, figsize=(15, 4.5))

    def series(key: str) -> list[float]:
        return [math.nan if r["summary"][key] is None else r["summary"][key] for r in runs]

    ax_tp.plot(xs, series("output_throughput"), "o-", label="output tokens/s")
    ax_tp.set_ylabel("output tokens/s")
    ax_req = ax_tp.twinx()
    ax_req.plot(xs, series("request_throughput"), "s--", color="tab:orange", label="requests/s")
    ax_req.set_ylabel("requests/s")
    ax_tp.set_title("throughput")
    for ax, name in ((ax_ttft, "ttft"), (ax_tpot, "tpot")):
        ax.plot(xs, series(f"median_{name}_ms"), "o-", label="p50")
        ax.plot(xs, series(f"p99_{name}_ms"), "s--", label="p99")
        ax.set_ylabel("ms")
        ax.set_title(name.upper())
        ax.legend()
    for ax in (ax_tp, ax_ttft, ax_tpot):
        ax.set_xlabel("max concurrency")
        if min(xs) > 0 and max(xs) / min(xs) >= 4:
            ax.set_xscale("log", base=2)
        ax.set_xticks(xs, [str(x) for x in xs])
        ax.grid(alpha=0.3)
    return fig


def _plot_distributions(plt, run: dict[str, Any]):
    ok = [r for r in run["requests"] if r["success"]]
    ttft = [r["ttft_s"] * 1e3 for r in ok if r["ttft_s"] is not None]
    itl = [g * 1e3 for r in ok for g in r["itl_s"]]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.5))
    for ax, values, name in ((axes[0], ttft, "TTFT"), (axes[1], itl, "ITL")):
        if values:
            ax.hist(values, bins=min(50, max(5, len(values) // 2)), color="tab:blue", alpha=0.8)
            for p, style in ((50, "-"), (99, "--")):
                v = percentile(values, p)
                ax.axvline(v, color="tab:red", linestyle=style, label=f"p{p} {v:.1f} ms")
            ax.legend()
        else:
            ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes)
        ax.set_xlabel("ms")
        ax.set_ylabel("count")
        ax.set_title(f"{name} (concurrency {_concurrency(run)}, {len(values)} values)")
    return fig


__all__ = [
    "SCOREBOARD_COLUMNS",
    "append_scoreboard",
    "check_matplotlib",
    "format_run",
    "format_sweep",
    "plot",
    "save_json",
    "scoreboard_header",
    "scoreboard_row",
]
