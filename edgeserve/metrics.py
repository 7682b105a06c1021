"""Prometheus metrics for `GET /metrics`, one registry per application (no module globals).

Names follow llama.cpp's server (`llamacpp:…`) where it has one, so existing Grafana boards work;
the rest are `edgeserve_…`:

    edgeserve_requests_total{route,status}          finished HTTP requests
    edgeserve_errors_total{status}                  4xx/5xx answers, in-band stream errors,
                                                    499 for clients that went away
    edgeserve_request_duration_seconds{route}       histogram, whole request
    edgeserve_time_to_first_token_seconds           histogram, chat requests
    edgeserve_time_per_output_token_seconds         histogram, after the first token
    llamacpp:prompt_tokens_total                    prompt tokens evaluated (cached ones excluded)
    llamacpp:tokens_predicted_total                 generated tokens
    llamacpp:tokens_predicted_seconds_total         time spent generating them
    llamacpp:predicted_tokens_seconds               generated tokens per second of generation
read from the engine at scrape time:
    llamacpp:prompt_tokens_cached_total             prompt tokens reused from the prefix cache
    edgeserve_prefix_cache_hits_total               requests that reused a cached prefix
    llamacpp:requests_processing                    busy sequence slots
    llamacpp:requests_deferred                      requests waiting in the queue
    llamacpp:kv_cache_tokens, llamacpp:kv_cache_usage_ratio   KV cells in use (older llama.cpp
                                                    servers' names, still used by its bench)
    edgeserve_slots, edgeserve_kv_cache_size_tokens, edgeserve_model_loaded, edgeserve_draining
    edgeserve_step_{fixed,row,prompt_token}_seconds   what a step costs, as the engine measured
                                                    it (prefill budget, speculation)
    edgeserve_engine_steps_total                    decodes run by the engine thread
    edgeserve_engine_phase_seconds_total{phase}     the engine thread's time in each phase of
                                                    its steps (engine/step_clock.py)
    edgeserve_prompt_cache_{entries,bytes}{tier}    prompts stored below the KV cache (ram,
    edgeserve_prompt_cache_{hits,misses}_total{tier}  disk), restores and lookups each served

With a catalogue of several models, every figure read from an engine carries a `model` label.

Observations come from one place, the request-context middleware, once per finished request.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Protocol

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from edgeserve.engine.types import EngineStats

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
"""The classic Prometheus text format, as llama.cpp's server answers."""

OTHER_ROUTE = "other"
"""The `route` label of requests to unknown paths (keeps the label set bounded)."""

CLIENT_CLOSED = 499
"""The status recorded for a request whose client went away first (nginx's convention)."""

_TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
_TPOT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
_DURATION_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 600.0)


class RequestFacts(Protocol):
    """What a handler learned about its request (http.keys.RequestRecord has these fields)."""

    prompt_tokens: int | None
    cached_tokens: int
    completion_tokens: int | None
    ttft_s: float | None
    gen_s: float | None
    error_status: int | None


class Metrics:
    """The counters and histograms of one server, plus the engine's figures read on scrape."""

    def __init__(
        self, stats: Callable[[], list[tuple[str, EngineStats]]], *, labelled: bool = False
    ) -> None:
        self.registry = CollectorRegistry()
        self._labelled = labelled  # several models: the engine's figures carry `model`
        self._prompt_tokens = 0
        self._predicted_tokens = 0
        self._predicted_seconds = 0.0
        self._requests = Counter(
            "edgeserve_requests",
            "Finished HTTP requests by route and status",
            ["route", "status"],
            registry=self.registry,
        )
        self._errors = Counter(
            "edgeserve_errors",
            "Requests that ended in an error, by status (in-band stream errors included; "
            "499 = the client went away)",
            ["status"],
            registry=self.registry,
        )
        self._duration = Histogram(
            "edgeserve_request_duration_seconds",
            "Time from the request's arrival to its last byte, by route",
            ["route"],
            buckets=_DURATION_BUCKETS,
            registry=self.registry,
        )
        self._ttft = Histogram(
            "edgeserve_time_to_first_token_seconds",
            "Time from a chat request's submission to the engine to its first generated text",
            buckets=_TTFT_BUCKETS,
            registry=self.registry,
        )
        self._tpot = Histogram(
            "edgeserve_time_per_output_token_seconds",
            "Generation time per token after the first (all choices of a request together)",
            buckets=_TPOT_BUCKETS,
            registry=self.registry,
        )
        self._stats = stats
        self.registry.register(self)  # for collect(): the totals below and the engine's figures

    def observe(self, route: str, status: int, elapsed_s: float, facts: RequestFacts) -> None:
        """Count one finished request; `status` is what the client got (499: it went away)."""
        self._requests.labels(route=route, status=str(status)).inc()
        self._duration.labels(route=route).observe(elapsed_s)
        error = facts.error_status or (status if status >= 400 else None)
        if error is not None:
            self._errors.labels(status=str(error)).inc()
        if facts.prompt_tokens is not None:
            self._prompt_tokens += max(0, facts.prompt_tokens - facts.cached_tokens)
        completion = facts.completion_tokens or 0
        self._predicted_tokens += completion
        if facts.gen_s is not None and completion:
            self._predicted_seconds += facts.gen_s
        if facts.ttft_s is not None:
            self._ttft.observe(facts.ttft_s)
            if facts.gen_s is not None and completion > 1:
                self._tpot.observe(facts.gen_s / (completion - 1))

    def exposition(self) -> bytes:
        """Everything in the Prometheus text format (see CONTENT_TYPE)."""
        return generate_latest(self.registry)

    def collect(self) -> Iterator[Metric]:
        """The plain totals and the engine's snapshot (the registry calls it on every scrape)."""
        yield from self._request_totals()
        yield from _engine_figures(_Rows(self._stats(), self._labelled))

    def _request_totals(self) -> Iterator[Metric]:
        """The token and time totals of the finished requests, and the speed they make."""
        yield _counter(
            "llamacpp:prompt_tokens",
            "Number of prompt tokens processed, excluding cached tokens",
            self._prompt_tokens,
        )
        yield _counter(
            "llamacpp:tokens_predicted",
            "Number of generation tokens processed",
            self._predicted_tokens,
        )
        yield _counter(
            "llamacpp:tokens_predicted_seconds",
            "Total time spent generating tokens",
            self._predicted_seconds,
        )
        speed = self._predicted_tokens / self._predicted_seconds if self._predicted_seconds else 0.0
        yield _gauge(
            "llamacpp:predicted_tokens_seconds",
            "Average generation throughput in tokens/s (per request, since start)",
            speed,
        )


# The figures read from each engine at scrape time: (type, name, help, value).
_ENGINE_FIGURES: tuple[tuple[str, str, str, Callable[[EngineStats], float]], ...] = (
    (
        "counter",
        "llamacpp:prompt_tokens_cached",
        "Number of prompt tokens reused from the prefix cache",
        lambda s: s.prefix_cached_tokens,
    ),
    (
        "counter",
        "edgeserve_prefix_cache_hits",
        "Requests whose prompt reused a cached prefix",
        lambda s: s.prefix_cache_hits,
    ),
    (
        "gauge",
        "llamacpp:requests_processing",
        "Number of requests processing",
        lambda s: s.busy_slots,
    ),
    (
        "counter",
        "edgeserve_draft_tokens",
        "Tokens drafted by speculation (n-gram or draft model) and verified",
        lambda s: s.draft_tokens,
    ),
    (
        "counter",
        "edgeserve_draft_accepted_tokens",
        "Drafted tokens that were the answer's",
        lambda s: s.draft_accepted_tokens,
    ),
    (
        "gauge",
        "edgeserve_step_fixed_seconds",
        "Measured cost of a generation step before its logit rows (0 until measured)",
        lambda s: s.step_fixed_seconds,
    ),
    (
        "gauge",
        "edgeserve_step_row_seconds",
        "Measured cost of one more logit row in a step (0 until measured)",
        lambda s: s.step_row_seconds,
    ),
    (
        "gauge",
        "edgeserve_step_prompt_token_seconds",
        "Measured cost of one prompt token in a step (0 until measured)",
        lambda s: s.step_prompt_token_seconds,
    ),
    (
        "counter",
        "edgeserve_engine_steps",
        "Decodes run by the engine thread",
        lambda s: s.engine_steps,
    ),
    (
        "gauge",
        "edgeserve_scoring_requests_processing",
        "Score and embeddings requests being decoded",
        lambda s: s.scoring_jobs,
    ),
    (
        "gauge",
        "llamacpp:requests_deferred",
        "Number of requests deferred",
        lambda s: s.queue_length,
    ),
    ("gauge", "llamacpp:kv_cache_tokens", "KV cache cells in use", lambda s: s.kv_cells_used),
    (
        "gauge",
        "llamacpp:kv_cache_usage_ratio",
        "KV cache usage (1 = all cells in use)",
        lambda s: s.kv_cells_used / s.n_ctx if s.n_ctx else 0.0,
    ),
    ("gauge", "edgeserve_slots", "Sequence slots (--parallel)", lambda s: s.parallel),
    ("gauge", "edgeserve_kv_cache_size_tokens", "KV cache cells (--ctx-size)", lambda s: s.n_ctx),
    ("gauge", "edgeserve_model_loaded", "1 once the model is loaded", lambda s: int(s.loaded)),
    ("gauge", "edgeserve_draining", "1 while shutting down", lambda s: int(s.draining)),
)


def _engine_figures(rows: _Rows) -> Iterator[Metric]:
    """Every engine's figures (`_ENGINE_FIGURES`), then where its thread spent its steps."""
    for kind, name, doc, value in _ENGINE_FIGURES:
        yield rows.counter(name, doc, value) if kind == "counter" else rows.gauge(name, doc, value)
    phases = CounterMetricFamily(
        "edgeserve_engine_phase_seconds",
        "The engine thread's time in each phase of its steps (decode: inside llama_decode)",
        labels=[*rows.labels, "phase"],
    )
    for model, stats in rows.rows:
        for phase, seconds in stats.phase_seconds:
            phases.add_metric([*rows.values(model), phase], seconds)
    yield phases
    for family, name, doc, field in _TIER_FIGURES:
        tiers = family(name, doc, labels=[*rows.labels, "tier"])
        for model, stats in rows.rows:
            for tier in stats.prompt_cache_tiers:
                tiers.add_metric([*rows.values(model), tier.tier], getattr(tier, field))
        yield tiers


# The prompt cache's tiers below the KV cache, labelled `tier` (ram, disk).
_TIER_FIGURES: tuple[tuple[type[Metric], str, str, str], ...] = (
    (GaugeMetricFamily, "edgeserve_prompt_cache_entries", "Stored prompts per tier", "entries"),
    (GaugeMetricFamily, "edgeserve_prompt_cache_bytes", "Bytes of stored prompts", "bytes"),
    (
        CounterMetricFamily,
        "edgeserve_prompt_cache_hits",
        "Prompts restored from a tier below the KV cache",
        "hits",
    ),
    (
        CounterMetricFamily,
        "edgeserve_prompt_cache_misses",
        "Lookups a tier could not serve",
        "misses",
    ),
)


class _Rows:
    """The engine figures of each model, as metric families: labelled `model` with several
    models, unlabelled (as llama.cpp's server has them) with one."""

    def __init__(self, rows: list[tuple[str, EngineStats]], labelled: bool) -> None:
        self.rows = rows
        self.labels = ["model"] if labelled else []

    def values(self, model: str) -> list[str]:
        """A row's label values."""
        return [model] if self.labels else []

    def counter(self, name: str, doc: str, value: Callable[[EngineStats], float]) -> Metric:
        """A counter family of `value` per model."""
        family = CounterMetricFamily(name, doc, labels=self.labels)
        for model, stats in self.rows:
            family.add_metric(self.values(model), value(stats))
        return family

    def gauge(self, name: str, doc: str, value: Callable[[EngineStats], float]) -> Metric:
        """A gauge family of `value` per model."""
        family = GaugeMetricFamily(name, doc, labels=self.labels)
        for model, stats in self.rows:
            family.add_metric(self.values(model), value(stats))
        return family


def _counter(name: str, doc: str, value: float) -> CounterMetricFamily:
    return CounterMetricFamily(name, doc, value=value)


def _gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, value=value)
