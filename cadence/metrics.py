"""Prometheus metrics of the server, names prefixed `cadence:`.

Gauges mirror the engine core's stats (sent with each of its messages); counters and
histograms are fed by the API server's output processor as tokens arrive.

Several API processes (--api-server-count) keep one set of series: their supervisor sets
PROMETHEUS_MULTIPROC_DIR before they start, each writes its values there (prometheus_client's
multiprocess mode) and whichever answers /metrics reads them all, counters and histograms
summed. The engine's own numbers reach every process but are recorded by the lead one only
(`lead`), so they are not counted once per process.
"""

from __future__ import annotations

import collections
import os

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.multiprocess import MultiProcessCollector

MULTIPROC_DIR_ENV = "PROMETHEUS_MULTIPROC_DIR"

_LATENCY_BUCKETS = (
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
)


def observe_times(series, value: float, times: int) -> None:
    """`times` observations of `value` in a histogram series, as one update of its bucket
    and its sum (prometheus_client has no weighted observe; without the internals this
    relies on, `times` plain observations)."""
    bounds = getattr(series, "_upper_bounds", None)
    buckets = getattr(series, "_buckets", None)
    total = getattr(series, "_sum", None)
    if times == 1 or bounds is None or buckets is None or total is None:
        for _ in range(times):
            series.observe(value)
        return
    total.inc(value * times)
    for bound, bucket in zip(bounds, buckets):
        if value <= bound:
            bucket.inc(times)
            break


class ServerMetrics:
    def __init__(self, model_name: str, lead: bool = True) -> None:
        """`lead`: this process records the engine's stats (the first API process)."""
        self.registry = r = CollectorRegistry()
        self.shared_dir = os.environ.get(MULTIPROC_DIR_ENV)  # (set: several API processes)
        self.lead = lead
        labels = ["model_name"]
        self.model_name = model_name
        # (multiprocess mode: the lead process alone sets them, the value is its latest)
        engine = {"multiprocess_mode": "mostrecent"}
        self.running = Gauge(
            "cadence:num_requests_running",
            "Sequences in the running batch",
            labels,
            registry=r,
            **engine,
        )
        self.waiting = Gauge(
            "cadence:num_requests_waiting",
            "Sequences waiting to be scheduled",
            labels,
            registry=r,
            **engine,
        )
        self.kv_usage = Gauge(
            "cadence:kv_cache_usage_perc",
            "Fraction of KV blocks in use (0-1)",
            labels,
            registry=r,
            **engine,
        )
        self.prefix_queries = Counter(
            "cadence:prefix_cache_queries",
            "Prompt tokens looked up in the prefix cache",
            labels,
            registry=r,
        )
        self.prefix_hits = Counter(
            "cadence:prefix_cache_hits",
            "Prompt tokens found in the prefix cache",
            labels,
            registry=r,
        )
        self.prefix_requests = Counter(
            "cadence:prefix_cache_requests",
            "Requests looked up in the prefix cache",
            labels,
            registry=r,
        )
        self.prefix_hit_requests = Counter(
            "cadence:prefix_cache_hit_requests",
            "Requests that reused at least one cached block",
            labels,
            registry=r,
        )
        self.prefix_evictions = Counter(
            "cadence:prefix_cache_evictions",
            "Cached KV blocks evicted for reuse",
            labels,
            registry=r,
        )
        self.preemptions = Counter(
            "cadence:num_preemptions", "Sequences preempted (recomputed later)", labels, registry=r
        )
        self.prompt_tokens = Counter(
            "cadence:prompt_tokens",
            "Prompt tokens of finished-prefill requests",
            labels,
            registry=r,
        )
        self.generation_tokens = Counter(
            "cadence:generation_tokens", "Generated tokens", labels, registry=r
        )
        self.requests_success = Counter(
            "cadence:request_success", "Finished requests", labels + ["finished_reason"], registry=r
        )
        self.rejected = Counter(
            "cadence:requests_rejected",
            "Requests refused with 429 by admission control",
            labels,
            registry=r,
        )
        self.structured_requests = Counter(
            "cadence:structured_output_requests",
            "Sequences with a grammar (JSON schema, regex, choice, EBNF)",
            labels,
            registry=r,
        )
        self.grammar_compiles = Counter(
            "cadence:grammar_compiles", "Grammars compiled (cache misses)", labels, registry=r
        )
        self.grammar_cache_hits = Counter(
            "cadence:grammar_cache_hits",
            "Constrained sequences whose grammar was already compiled or compiling",
            labels,
            registry=r,
        )
        self.jump_forward_tokens = Counter(
            "cadence:jump_forward_tokens",
            "Tokens a grammar forced, appended without sampling",
            labels,
            registry=r,
        )
        self.spec_drafts = Counter(
            "cadence:spec_decode_num_drafts",
            "Speculative decoding: verifications (one request's drafts checked in one step)",
            labels,
            registry=r,
        )
        self.spec_draft_tokens = Counter(
            "cadence:spec_decode_num_draft_tokens",
            "Speculative decoding: draft tokens verified",
            labels,
            registry=r,
        )
        self.spec_accepted_tokens = Counter(
            "cadence:spec_decode_num_accepted_tokens",
            "Speculative decoding: draft tokens the target accepted",
            labels,
            registry=r,
        )
        self.spec_accepted_per_pos = Counter(
            "cadence:spec_decode_num_accepted_tokens_per_pos",
            "Speculative decoding: verifications whose draft at this position (0-based) was "
            "accepted; divided by cadence:spec_decode_num_drafts, the acceptance rate there",
            labels + ["position"],
            registry=r,
        )
        self.spec_acceptance_length = Histogram(
            "cadence:spec_decode_acceptance_length",
            "Speculative decoding: tokens a verification yielded (accepted drafts + 1)",
            labels,
            buckets=tuple(range(1, 18)),
            registry=r,
        )
        self.ttft = Histogram(
            "cadence:time_to_first_token_seconds",
            "Time to first token",
            labels,
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.itl = Histogram(
            "cadence:inter_token_latency_seconds",
            "Time between tokens of a request",
            labels,
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.e2e = Histogram(
            "cadence:e2e_request_latency_seconds",
            "Arrival to last token",
            labels,
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.kv_loads = Counter(
            "cadence:kv_transfer_loads",
            "Prompt K/V loads from a prefill engine that ended with the K/V here",
            labels,
            registry=r,
        )
        self.kv_loaded_tokens = Counter(
            "cadence:kv_transfer_loaded_tokens",
            "Prompt tokens whose K/V was loaded from a prefill engine",
            labels,
            registry=r,
        )
        self.kv_failed_loads = Counter(
            "cadence:kv_transfer_failed_loads",
            "K/V loads that failed (the prompt was computed here)",
            labels,
            registry=r,
        )
        self.kv_load_seconds = Counter(
            "cadence:kv_transfer_load_seconds",
            "Time from the start of each K/V load to its end, summed",
            labels,
            registry=r,
        )
        self.kv_saved_tokens = Counter(
            "cadence:kv_transfer_saved_tokens",
            "Prompt tokens whose K/V this prefill engine staged for a decode engine",
            labels,
            registry=r,
        )
        adapter = ["model_name", "lora_name"]
        self.lora_running = Gauge(
            "cadence:lora_requests_running",
            "Sequences running, per LoRA adapter",
            adapter,
            registry=r,
            **engine,
        )
        self.lora_waiting = Gauge(
            "cadence:lora_requests_waiting",
            "Sequences waiting, per LoRA adapter",
            adapter,
            registry=r,
            **engine,
        )
        self.lora_slot_loads = Counter(
            "cadence:lora_slot_loads",
            "LoRA adapters written into a GPU slot (an adapter swapped in)",
            labels,
            registry=r,
        )
        self._lora_names: set[str] = set()  # adapters with a series (set to 0 when idle)
        self.images_encoded = Counter(
            "cadence:images_encoded",
            "Images run through the vision encoder (not found in its cache)",
            labels,
            registry=r,
        )
        self.image_cache_hits = Counter(
            "cadence:image_encoder_cache_hits",
            "Images whose encoder output a step found cached (by content hash)",
            labels,
            registry=r,
        )
        self.image_tokens = Counter(
            "cadence:image_tokens",
            "Prompt placeholder tokens filled with image features",
            labels,
            registry=r,
        )
        self.queue_time = Histogram(
            "cadence:request_queue_time_seconds",
            "Arrival to first scheduled",
            labels,
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        # EngineStats field -> the counter it feeds (the engine sends running totals).
        self._engine_counters = {
            "prefix_queries": self.prefix_queries,
            "prefix_hits": self.prefix_hits,
            "num_preemptions": self.preemptions,
            "prefix_requests": self.prefix_requests,
            "prefix_hit_requests": self.prefix_hit_requests,
            "prefix_evictions": self.prefix_evictions,
            "structured_requests": self.structured_requests,
            "grammar_compiles": self.grammar_compiles,
            "grammar_cache_hits": self.grammar_cache_hits,
            "jump_forward_tokens": self.jump_forward_tokens,
            "spec_verifications": self.spec_drafts,
            "spec_draft_tokens": self.spec_draft_tokens,
            "spec_accepted_tokens": self.spec_accepted_tokens,
            "kv_transfer_loads": self.kv_loads,
            "kv_transfer_loaded_tokens": self.kv_loaded_tokens,
            "kv_transfer_failed_loads": self.kv_failed_loads,
            "kv_transfer_load_seconds": self.kv_load_seconds,
            "kv_transfer_saved_tokens": self.kv_saved_tokens,
            "lora_slot_loads": self.lora_slot_loads,
            "images_encoded": self.images_encoded,
            "image_cache_hits": self.image_cache_hits,
            "image_tokens": self.image_tokens,
        }
        self._last_per_pos: list[int] = []
        self._last_lengths: list[int] = []
        self._last_engine = dict.fromkeys(self._engine_counters, 0)
        # metric -> its series for this model: prometheus's labels() takes a lock and builds
        # a key each call, and the observers below run for every engine message.
        self._series: dict[object, object] = {}
        if lead:
            for m in (self.running, self.waiting, self.kv_usage):
                m.labels(model_name).set(0)
        # Create every labelled series now, so /metrics lists them (at 0) from the start.
        for m in (
            self.prefix_queries,
            self.prefix_hits,
            self.prefix_requests,
            self.prefix_hit_requests,
            self.prefix_evictions,
            self.preemptions,
            *self._engine_counters.values(),
            self.prompt_tokens,
            self.generation_tokens,
            self.rejected,
            self.ttft,
            self.itl,
            self.e2e,
            self.queue_time,
        ):
            m.labels(model_name)

    def _l(self, metric):
        series = self._series.get(metric)
        if series is None:
            series = self._series[metric] = metric.labels(self.model_name)
        return series

    def update_engine_stats(self, stats) -> None:
        if not self.lead:
            return
        self._l(self.running).set(stats.num_running)
        self._l(self.waiting).set(stats.num_waiting)
        self._l(self.kv_usage).set(stats.kv_usage)
        for name, counter in self._engine_counters.items():
            new = getattr(stats, name)
            self._l(counter).inc(max(0, new - self._last_engine[name]))
            self._last_engine[name] = new
        self._update_lora(stats.lora_running, stats.lora_waiting)
        per_pos = stats.spec_accepted_per_position
        for i, total in enumerate(per_pos):
            before = self._last_per_pos[i] if i < len(self._last_per_pos) else 0
            self.spec_accepted_per_pos.labels(self.model_name, str(i)).inc(max(0, total - before))
        self._last_per_pos = list(per_pos)
        lengths = stats.spec_acceptance_lengths
        for n, total in enumerate(lengths):
            before = self._last_lengths[n] if n < len(self._last_lengths) else 0
            for _ in range(max(0, total - before)):  # the engine sends running counts
                self._l(self.spec_acceptance_length).observe(n)
        self._last_lengths = list(lengths)

    def _update_lora(self, running: dict[str, int], waiting: dict[str, int]) -> None:
        self._lora_names |= running.keys() | waiting.keys()
        for name in self._lora_names:
            self.lora_running.labels(self.model_name, name).set(running.get(name, 0))
            self.lora_waiting.labels(self.model_name, name).set(waiting.get(name, 0))

    # RequestObserver
    def on_first_token(self, ttft: float, queue_time: float | None, num_prompt_tokens: int) -> None:
        self._l(self.ttft).observe(ttft)
        if queue_time is not None:
            self._l(self.queue_time).observe(max(0.0, queue_time))
        self._l(self.prompt_tokens).inc(num_prompt_tokens)

    def on_tokens(self, num_tokens: int, inter_token_latencies: list[float]) -> None:
        self._l(self.generation_tokens).inc(num_tokens)
        # The requests of one step mostly share their gap (their last tokens came in one
        # message): one histogram update per distinct gap, not one per token.
        series = self._l(self.itl)
        for gap, times in collections.Counter(inter_token_latencies).items():
            observe_times(series, gap, times)

    def on_finished(self, e2e: float, finish_reason: str) -> None:
        self._l(self.e2e).observe(e2e)
        self.requests_success.labels(self.model_name, finish_reason).inc()

    def _collect_from(self) -> CollectorRegistry:
        """The registry to read: this process's, or every API process's values."""
        if self.shared_dir is None:
            return self.registry
        merged = CollectorRegistry()
        MultiProcessCollector(merged, self.shared_dir)
        return merged

    def render(self) -> bytes:
        return generate_latest(self._collect_from())

    def samples(self) -> dict[str, float]:
        """Every sample /metrics would render, summed over model names: name -> value, with
        a label other than model_name kept in the key (`name{label="value"}`)."""
        out: dict[str, float] = {}
        for family in self._collect_from().collect():
            for s in family.samples:
                extra = ",".join(f'{k}="{v}"' for k, v in s.labels.items() if k != "model_name")
                key = f"{s.name}{{{extra}}}" if extra else s.name
                out[key] = out.get(key, 0.0) + s.value
        return out
