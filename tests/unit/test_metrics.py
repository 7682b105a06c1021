"""Prometheus metrics: names, values, per-app registries, engine figures read on scrape."""

from __future__ import annotations

from dataclasses import dataclass, replace

import pytest
from prometheus_client.parser import text_string_to_metric_families

from edgeserve.engine.types import EngineStats
from edgeserve.metrics import CLIENT_CLOSED, Metrics

STATS = EngineStats(
    loaded=True,
    n_ctx=1000,
    parallel=4,
    busy_slots=3,
    queue_length=2,
    scoring_jobs=1,
    gpu_offload=False,
    n_gpu_layers=0,
    kv_cells_used=250,
    prefix_cache_hits=5,
    prefix_cached_tokens=120,
    step_fixed_seconds=0.006,
    step_row_seconds=0.014,
    step_prompt_token_seconds=0.0015,
)


@dataclass
class Facts:
    prompt_tokens: int | None = None
    cached_tokens: int = 0
    completion_tokens: int | None = None
    ttft_s: float | None = None
    gen_s: float | None = None
    error_status: int | None = None


def samples(metrics: Metrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of the exposition, keyed by name and sorted labels."""
    text = metrics.exposition().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def value(metrics: Metrics, name: str, **labels: str) -> float:
    return samples(metrics)[(name, tuple(sorted(labels.items())))]


def test_engine_figures_are_read_at_scrape_time():
    current = [STATS]
    metrics = Metrics(lambda: [("m", current[0])])
    assert value(metrics, "llamacpp:requests_processing") == 3
    assert value(metrics, "llamacpp:requests_deferred") == 2
    assert value(metrics, "edgeserve_scoring_requests_processing") == 1
    assert value(metrics, "llamacpp:kv_cache_tokens") == 250
    assert value(metrics, "llamacpp:kv_cache_usage_ratio") == 0.25
    assert value(metrics, "llamacpp:prompt_tokens_cached_total") == 120
    assert value(metrics, "edgeserve_prefix_cache_hits_total") == 5
    assert value(metrics, "edgeserve_slots") == 4
    assert value(metrics, "edgeserve_kv_cache_size_tokens") == 1000
    assert value(metrics, "edgeserve_model_loaded") == 1
    assert value(metrics, "edgeserve_draining") == 0
    assert value(metrics, "edgeserve_step_fixed_seconds") == 0.006
    assert value(metrics, "edgeserve_step_row_seconds") == 0.014
    assert value(metrics, "edgeserve_step_prompt_token_seconds") == 0.0015
    current[0] = replace(STATS, busy_slots=0, queue_length=0, kv_cells_used=0, draining=True)
    assert value(metrics, "llamacpp:requests_processing") == 0
    assert value(metrics, "llamacpp:kv_cache_usage_ratio") == 0
    assert value(metrics, "edgeserve_draining") == 1


def test_a_finished_chat_request():
    metrics = Metrics(lambda: [("m", STATS)])
    facts = Facts(prompt_tokens=100, cached_tokens=60, completion_tokens=11, ttft_s=0.2, gen_s=0.5)
    metrics.observe("/v1/chat/completions", 200, 0.8, facts)
    route = {"route": "/v1/chat/completions"}
    assert value(metrics, "edgeserve_requests_total", status="200", **route) == 1
    assert value(metrics, "llamacpp:prompt_tokens_total") == 40  # cached tokens excluded
    assert value(metrics, "llamacpp:tokens_predicted_total") == 11
    assert value(metrics, "llamacpp:tokens_predicted_seconds_total") == 0.5
    assert value(metrics, "llamacpp:predicted_tokens_seconds") == 22
    assert value(metrics, "edgeserve_time_to_first_token_seconds_count") == 1
    assert value(metrics, "edgeserve_time_to_first_token_seconds_sum") == 0.2
    assert value(metrics, "edgeserve_time_to_first_token_seconds_bucket", le="0.25") == 1
    assert value(metrics, "edgeserve_time_to_first_token_seconds_bucket", le="0.1") == 0
    assert value(metrics, "edgeserve_time_per_output_token_seconds_sum") == pytest.approx(0.05)
    assert value(metrics, "edgeserve_request_duration_seconds_count", **route) == 1
    assert not any(name == "edgeserve_errors_total" for name, _ in samples(metrics))


def test_errors_by_status():
    metrics = Metrics(lambda: [("m", STATS)])
    metrics.observe("/v1/chat/completions", 400, 0.01, Facts())
    metrics.observe("/v1/chat/completions", 400, 0.01, Facts())
    metrics.observe("other", 404, 0.01, Facts())
    metrics.observe("/v1/chat/completions", CLIENT_CLOSED, 1.0, Facts())
    # A stream that had answered 200 and then ended with an in-band timeout event.
    metrics.observe("/v1/chat/completions", 200, 2.0, Facts(error_status=504))
    assert value(metrics, "edgeserve_errors_total", status="400") == 2
    assert value(metrics, "edgeserve_errors_total", status="404") == 1
    assert value(metrics, "edgeserve_errors_total", status="499") == 1
    assert value(metrics, "edgeserve_errors_total", status="504") == 1
    assert value(metrics, "edgeserve_requests_total", route="other", status="404") == 1
    assert (
        value(metrics, "edgeserve_requests_total", route="/v1/chat/completions", status="200") == 1
    )


def test_score_requests_count_prompt_tokens_only():
    metrics = Metrics(lambda: [("m", STATS)])
    metrics.observe("/v1/score/evaluation", 200, 0.1, Facts(prompt_tokens=30))
    assert value(metrics, "llamacpp:prompt_tokens_total") == 30
    assert value(metrics, "llamacpp:tokens_predicted_total") == 0
    assert value(metrics, "llamacpp:predicted_tokens_seconds") == 0
    assert value(metrics, "edgeserve_time_to_first_token_seconds_count") == 0


def test_one_token_answers_have_no_per_token_latency():
    metrics = Metrics(lambda: [("m", STATS)])
    facts = Facts(prompt_tokens=5, completion_tokens=1, ttft_s=0.1, gen_s=0.0)
    metrics.observe("/v1/chat/completions", 200, 0.1, facts)
    assert value(metrics, "edgeserve_time_per_output_token_seconds_count") == 0
    assert value(metrics, "edgeserve_time_to_first_token_seconds_count") == 1


def test_each_app_has_its_own_registry():
    first, second = Metrics(lambda: [("m", STATS)]), Metrics(lambda: [("m", STATS)])
    first.observe("/health", 200, 0.001, Facts())
    assert value(first, "edgeserve_requests_total", route="/health", status="200") == 1
    assert ("edgeserve_requests_total", (("route", "/health"), ("status", "200"))) not in samples(
        second
    )


def test_llama_cpp_names_and_types():
    metrics = Metrics(lambda: [("m", STATS)])
    types = {
        family.name: family.type
        for family in text_string_to_metric_families(metrics.exposition().decode())
    }
    expected = {
        "llamacpp:prompt_tokens": "counter",
        "llamacpp:prompt_tokens_cached": "counter",
        "llamacpp:tokens_predicted": "counter",
        "llamacpp:tokens_predicted_seconds": "counter",
        "llamacpp:predicted_tokens_seconds": "gauge",
        "llamacpp:requests_processing": "gauge",
        "llamacpp:requests_deferred": "gauge",
        "llamacpp:kv_cache_tokens": "gauge",
        "llamacpp:kv_cache_usage_ratio": "gauge",
        "edgeserve_time_to_first_token_seconds": "histogram",
        "edgeserve_time_per_output_token_seconds": "histogram",
    }
    assert {name: types.get(name) for name in expected} == expected


def test_with_several_models_every_engine_figure_carries_the_model():
    busy = replace(STATS, busy_slots=3)
    metrics = Metrics(lambda: [("a", STATS), ("b", busy)], labelled=True)
    assert value(metrics, "llamacpp:requests_processing", model="a") == STATS.busy_slots
    assert value(metrics, "llamacpp:requests_processing", model="b") == 3
    engine_families = {
        name
        for name, labels in samples(metrics)
        if name.startswith(("edgeserve_kv", "llamacpp:kv"))
    }
    assert engine_families
    assert all(
        ("model", "a") in labels or ("model", "b") in labels
        for name, labels in samples(metrics)
        if name in engine_families
    )
    unlabelled = Metrics(lambda: [("a", STATS)])
    assert value(unlabelled, "llamacpp:requests_processing") == STATS.busy_slots
