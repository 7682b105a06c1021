"""/metrics, request ids, keys and the per-request timeout, over HTTP with the real model."""

from __future__ import annotations

import asyncio
import re

from prometheus_client.parser import text_string_to_metric_families

from edgeserve.api.reference.detail import Detail
from tests.integration.conftest import EOS_BAN
from tests.integration.engine_idle import assert_engine_idle
from tests.integration.sse_client import parse_events
from tests.integration.test_chat import chat

CHAT = "/v1/chat/completions"
KEY = {"Authorization": "Bearer k"}


async def scrape(client, headers=None) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    resp = await client.get("/metrics", headers=headers or {})
    assert resp.status == 200, await resp.text()
    assert resp.headers["Content-Type"] == "text/plain; version=0.0.4; charset=utf-8"
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(await resp.text())
        for s in family.samples
    }


def sample(found, name: str, **labels: str) -> float | None:
    return found.get((name, tuple(sorted(labels.items()))))


# ---- /metrics ---------------------------------------------------------------------------------


async def test_metrics_need_the_key_when_one_is_set(make_client):
    client = await make_client(api_keys=("k",))
    for headers in ({}, {"Authorization": "Bearer wrong"}):
        resp = await client.get("/metrics", headers=headers)
        assert resp.status == 401
        assert await resp.json() == {"detail": "Invalid API key.", "message": "Invalid API key."}
    await scrape(client, KEY)
    assert (await client.get("/health")).status == 200  # /health stays public


async def test_metrics_without_keys_configured(client):
    found = await scrape(client)
    assert sample(found, "edgeserve_model_loaded") == 1
    assert sample(found, "edgeserve_slots") == 8


async def test_metrics_say_where_the_engine_thread_spent_its_steps(client):
    # The phases cut each step's wall time into pieces: after a streamed answer they have
    # grown by no more than the time that passed (a stretch counted twice would exceed it),
    # llama_decode took some of it and so did sampling and each token's bookkeeping.
    phases = ("intake", "plan", "decode", "sample", "account", "deliver", "loops")
    before = await scrape(client)
    started = asyncio.get_running_loop().time()
    body = chat(max_tokens=8, temperature=0.7, seed=3, logit_bias=EOS_BAN, stream=True)
    resp = await client.post(CHAT, json=body)
    assert resp.status == 200
    events, done = parse_events(await resp.read())
    assert done and len(events) >= 8
    elapsed = asyncio.get_running_loop().time() - started
    after = await scrape(client)
    grown = {
        phase: sample(after, "edgeserve_engine_phase_seconds_total", phase=phase)
        - sample(before, "edgeserve_engine_phase_seconds_total", phase=phase)
        for phase in phases
    }
    steps = sample(after, "edgeserve_engine_steps_total") - sample(
        before, "edgeserve_engine_steps_total"
    )
    assert steps >= 2  # the prompt, then at least one step a generated token after the first
    assert all(seconds >= 0 for seconds in grown.values()), grown
    assert grown["decode"] > 0 and grown["sample"] > 0 and grown["account"] > 0, grown
    assert grown["loops"] > 0, grown  # on the CPU each decode waits for the loop to send
    assert sum(grown.values()) <= elapsed, (grown, elapsed)


async def test_metrics_count_a_chat_request(client):
    body = chat(max_tokens=6, temperature=0, logit_bias=EOS_BAN)
    resp = await client.post(CHAT, json=body)
    assert resp.status == 200
    usage = (await resp.json())["usage"]
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
    found = await scrape(client)
    assert sample(found, "edgeserve_requests_total", route=CHAT, status="200") == 1
    assert sample(found, "llamacpp:tokens_predicted_total") == usage["completion_tokens"] == 6
    assert sample(found, "llamacpp:prompt_tokens_total") == usage["prompt_tokens"] - cached
    assert sample(found, "edgeserve_time_to_first_token_seconds_count") == 1
    assert sample(found, "edgeserve_time_per_output_token_seconds_count") == 1
    assert sample(found, "llamacpp:tokens_predicted_seconds_total") > 0
    assert sample(found, "llamacpp:requests_processing") == 0


async def test_metrics_count_a_stream_and_a_score(client):
    body = chat(max_tokens=4, temperature=0, logit_bias=EOS_BAN, stream=True)
    resp = await client.post(CHAT, json=body)
    _, done = parse_events(await resp.read())
    assert done
    resp = await client.post("/v1/score/evaluation", json={"model": "m", "messages": ["a b c"]})
    assert resp.status == 200
    found = await scrape(client)
    assert sample(found, "edgeserve_requests_total", route=CHAT, status="200") == 1
    route = "/v1/score/evaluation"
    assert sample(found, "edgeserve_requests_total", route=route, status="200") == 1
    assert sample(found, "llamacpp:tokens_predicted_total") == 4


async def test_busy_slots_and_kv_cells_while_generating(client, engine):
    body = chat(max_tokens=400, temperature=0, logit_bias=EOS_BAN, stream=True)
    resp = await client.post(CHAT, json=body)
    for _ in range(3):
        await resp.content.readuntil(b"\n\n")
    found = await scrape(client)
    assert sample(found, "llamacpp:requests_processing") == 1
    assert sample(found, "llamacpp:kv_cache_tokens") > 0
    assert 0 < sample(found, "llamacpp:kv_cache_usage_ratio") < 1
    resp.close()
    await assert_engine_idle(engine)


async def test_errors_by_status_and_unknown_routes(client):
    assert (await client.post(CHAT, data=b"{not json")).status == 422
    assert (await client.post(CHAT, json=chat(max_tokens=0))).status == 400
    assert (await client.get("/v1/nope")).status == 404
    found = await scrape(client)
    assert sample(found, "edgeserve_errors_total", status="422") == 1
    assert sample(found, "edgeserve_errors_total", status="400") == 1
    assert sample(found, "edgeserve_errors_total", status="404") == 1
    assert sample(found, "edgeserve_requests_total", route="other", status="404") == 1
    assert sample(found, "edgeserve_requests_total", route=CHAT, status="400") == 1


async def test_a_client_that_goes_away_counts_as_499(client, engine):
    body = chat(max_tokens=400, temperature=0, logit_bias=EOS_BAN, stream=True)
    resp = await client.post(CHAT, json=body)
    await resp.content.readuntil(b"\n\n")
    resp.close()
    await assert_engine_idle(engine)
    for _ in range(100):
        found = await scrape(client)
        if sample(found, "edgeserve_errors_total", status="499"):
            break
        await asyncio.sleep(0.02)
    assert sample(found, "edgeserve_errors_total", status="499") == 1


async def test_root_path_routes_share_labels(make_client):
    client = await make_client(root_path="/llm")
    assert (await client.get("/llm/v1/models")).status == 200
    found = await scrape(client)
    assert sample(found, "edgeserve_requests_total", route="/v1/models", status="200") == 1


# ---- request ids ------------------------------------------------------------------------------


async def test_request_id_is_echoed_or_generated(client):
    resp = await client.get("/v1/models", headers={"X-Request-Id": "abc-123"})
    assert resp.headers["X-Request-Id"] == "abc-123"
    resp = await client.get("/v1/models")
    assert re.fullmatch(r"[0-9a-f]{32}", resp.headers["X-Request-Id"])
    resp = await client.post(CHAT, json=chat(max_tokens=0), headers={"X-Request-Id": "bad-1"})
    assert resp.status == 400
    assert resp.headers["X-Request-Id"] == "bad-1"


# ---- per-request timeout ----------------------------------------------------------------------

TIMEOUT_DETAIL = Detail.REQUEST_TIMEOUT.format(seconds=0.3)


async def test_non_stream_past_the_timeout_is_504_and_frees_the_slot(make_client, engine):
    client = await make_client(request_timeout_s=0.3)
    body = chat(max_tokens=1000, temperature=0, logit_bias=EOS_BAN)
    resp = await client.post(CHAT, json=body)
    assert resp.status == 504
    assert await resp.json() == {"detail": TIMEOUT_DETAIL, "message": TIMEOUT_DETAIL}
    await assert_engine_idle(engine)
    found = await scrape(client)
    assert sample(found, "edgeserve_errors_total", status="504") == 1


async def test_stream_past_the_timeout_ends_with_an_error_event(make_client, engine):
    # Long enough for the stream to start even on a busy machine; far too short for its tokens.
    client = await make_client(request_timeout_s=1.0)
    body = chat(max_tokens=1500, temperature=0, logit_bias=EOS_BAN, stream=True)
    resp = await client.post(CHAT, json=body)
    assert resp.status == 200
    events, done = parse_events(await resp.read())
    assert done
    detail = Detail.REQUEST_TIMEOUT.format(seconds=1.0)
    assert events[-1] == {"error": {"message": detail, "type": "server_error", "code": 504}}
    assert any(e.get("choices") and e["choices"][0]["delta"].get("content") for e in events)
    await assert_engine_idle(engine)
    found = await scrape(client)
    assert sample(found, "edgeserve_requests_total", route=CHAT, status="200") == 1
    assert sample(found, "edgeserve_errors_total", status="504") == 1


async def test_requests_within_the_timeout_are_untouched(make_client):
    client = await make_client(request_timeout_s=60)
    resp = await client.post(CHAT, json=chat(max_tokens=5, temperature=0, logit_bias=EOS_BAN))
    assert resp.status == 200
    assert (await resp.json())["choices"][0]["finish_reason"] == "length"


async def test_score_past_the_timeout_is_504(make_client):
    client = await make_client(request_timeout_s=0.001)
    texts = ["The quick brown fox jumps over the lazy dog. " * 20] * 8
    resp = await client.post("/v1/score/evaluation", json={"model": "m", "messages": texts})
    assert resp.status == 504
    assert (await resp.json())["detail"] == Detail.REQUEST_TIMEOUT.format(seconds=0.001)
    for _ in range(100):  # the cancelled job leaves the queue at the engine's next step
        health = await (await client.get("/health")).json()
        if health["queue_length"] == 0:
            break
        await asyncio.sleep(0.05)
    assert health["queue_length"] == 0 and health["busy_slots"] == 0
