"""Chat completions against the real default model over HTTP."""

from __future__ import annotations

import asyncio
import json

from tests.integration.conftest import EOS_BAN
from tests.integration.sse_client import parse_events, stream_text

HELLO = [{"role": "user", "content": "Say hello."}]


def chat(**fields):
    return {"model": "m", "messages": HELLO, **fields}


async def test_non_stream_shape(client):
    resp = await client.post("/v1/chat/completions", json=chat(max_tokens=8, temperature=0))
    assert resp.status == 200
    assert resp.headers["Content-Type"] == "application/json"
    raw = await resp.read()
    body = json.loads(raw)
    assert list(body) == ["id", "object", "created", "model", "choices", "usage"]
    assert body["id"].startswith("chatcmpl-") and len(body["id"]) == 41
    assert body["object"] == "chat.completion" and body["model"] == "m"
    choice = body["choices"][0]
    assert choice["message"]["role"] == "assistant" and choice["message"]["tool_calls"] is None
    assert choice["finish_reason"] in ("stop", "length")
    usage = body["usage"]
    assert usage["prompt_tokens"] > 5
    assert 1 <= usage["completion_tokens"] <= 8
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    assert b": " not in raw.split(b'"content"')[0], "compact JSON"


async def test_stream_format_and_done(client):
    resp = await client.post(
        "/v1/chat/completions", json=chat(max_tokens=6, temperature=0, stream=True)
    )
    assert resp.status == 200
    assert resp.headers["Content-Type"] == "text/event-stream; charset=utf-8"
    assert resp.headers["Cache-Control"] == "no-store"
    assert resp.headers["X-Accel-Buffering"] == "no"
    events, done = parse_events(await resp.read())
    assert done
    first, last = events[0], events[-1]
    assert first["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert {e["id"] for e in events} == {first["id"]}
    assert all(e["object"] == "chat.completion.chunk" and e["model"] == "m" for e in events)
    finishes = [e["choices"][0]["finish_reason"] for e in events]
    assert finishes[:-1] == [None] * (len(events) - 1)
    assert last["choices"][0]["delta"] == {} and finishes[-1] in ("stop", "length")
    assert all(e["choices"][0]["delta"].get("content") != "" for e in events[1:-1])


async def test_stream_equals_non_stream_when_greedy(client):
    body = chat(max_tokens=12, temperature=0)
    plain = await (await client.post("/v1/chat/completions", json=body)).json()
    resp = await client.post("/v1/chat/completions", json={**body, "stream": True})
    events, _ = parse_events(await resp.read())
    assert stream_text(events) == plain["choices"][0]["message"]["content"]


async def test_max_tokens_finishes_with_length(client):
    body = chat(max_tokens=5, temperature=0, logit_bias=EOS_BAN)
    resp = await client.post("/v1/chat/completions", json=body)
    data = await resp.json()
    assert data["choices"][0]["finish_reason"] == "length"
    assert data["usage"]["completion_tokens"] == 5
    resp = await client.post("/v1/chat/completions", json={**body, "stream": True})
    events, _ = parse_events(await resp.read())
    assert events[-1]["choices"][0]["finish_reason"] == "length"


async def test_greedy_is_deterministic(client):
    body = chat(max_tokens=16, temperature=0)
    a = await (await client.post("/v1/chat/completions", json=body)).json()
    b = await (await client.post("/v1/chat/completions", json=body)).json()
    assert a["choices"][0]["message"]["content"] == b["choices"][0]["message"]["content"]


async def test_seed_makes_sampling_deterministic(client):
    body = chat(max_tokens=16, temperature=1.0, top_p=0.95, seed=1234)
    a = await (await client.post("/v1/chat/completions", json=body)).json()
    b = await (await client.post("/v1/chat/completions", json=body)).json()
    assert a["choices"][0]["message"]["content"] == b["choices"][0]["message"]["content"]


async def test_n_three_choices(client):
    body = chat(max_tokens=8, temperature=1.0, seed=7, n=3, logit_bias=EOS_BAN)
    data = await (await client.post("/v1/chat/completions", json=body)).json()
    assert [c["index"] for c in data["choices"]] == [0, 1, 2]
    assert all(c["finish_reason"] == "length" for c in data["choices"])
    assert data["usage"]["completion_tokens"] == 24
    texts = {c["message"]["content"] for c in data["choices"]}
    assert len(texts) > 1, "siblings sample independently"


async def test_stop_string_cuts_text(client):
    body = chat(max_tokens=24, temperature=0, logit_bias=EOS_BAN)
    full = (await (await client.post("/v1/chat/completions", json=body)).json())["choices"][0]
    text = full["message"]["content"]
    stop = text[len(text) // 2 : len(text) // 2 + 3]
    assert len(stop) == 3
    for stream in (False, True):
        resp = await client.post(
            "/v1/chat/completions", json={**body, "stop": [stop], "stream": stream}
        )
        if stream:
            events, _ = parse_events(await resp.read())
            got, reason = stream_text(events), events[-1]["choices"][0]["finish_reason"]
        else:
            data = (await resp.json())["choices"][0]
            got, reason = data["message"]["content"], data["finish_reason"]
        assert got == text[: text.index(stop)]
        assert reason == "stop"


async def test_stop_string_split_across_tokens(client, engine):
    body = chat(max_tokens=24, temperature=0, logit_bias=EOS_BAN)
    text = (await (await client.post("/v1/chat/completions", json=body)).json())["choices"][0][
        "message"
    ]["content"]
    pieces = engine.backend.tokenize(text, add_special=False, parse_special=False)
    spans, pos = [], 0
    for token in pieces:
        piece = engine.backend.piece(token).decode("utf-8", "replace")
        spans.append((pos, pos + len(piece)))
        pos += len(piece)
    boundary = next(end for start, end in spans[2:] if end - start >= 2 and end < len(text) - 2)
    stop = text[boundary - 2 : boundary + 2]
    assert text.index(stop) == boundary - 2, "the stop string spans a token boundary"
    resp = await client.post("/v1/chat/completions", json={**body, "stop": stop, "stream": True})
    events, _ = parse_events(await resp.read())
    assert stream_text(events) == text[: boundary - 2]
    assert events[-1]["choices"][0]["finish_reason"] == "stop"


async def test_eight_concurrent_streams_complete(client):
    max_tokens = 12

    async def one(i: int) -> tuple[str, str, int]:
        body = chat(max_tokens=max_tokens, temperature=0.8, seed=i, logit_bias=EOS_BAN)
        body["messages"] = [{"role": "user", "content": f"Tell story number {i}."}]
        resp = await client.post(
            "/v1/chat/completions",
            json={**body, "stream": True, "stream_options": {"include_usage": True}},
        )
        raw = await resp.read()
        raw.decode("utf-8")
        events, done = parse_events(raw)
        assert done
        usage = events[-1]["usage"]
        return (
            stream_text(events),
            events[-2]["choices"][0]["finish_reason"],
            usage["completion_tokens"],
        )

    results = await asyncio.gather(*(one(i) for i in range(8)))
    for text, reason, completion in results:
        assert reason == "length"
        assert completion == max_tokens
        assert text


async def test_context_overflow_is_400_naming_both_counts(client):
    long_text = "word " * 4000
    body = {"model": "m", "messages": [{"role": "user", "content": long_text}]}
    for stream in (False, True):
        resp = await client.post("/v1/chat/completions", json={**body, "stream": stream})
        assert resp.status == 400
        detail = (await resp.json())["detail"]
        assert "2048" in detail
        assert any(w.isdigit() and int(w) > 2048 for w in detail.replace(",", " ").split())


async def test_health_and_models(client):
    health = await client.get("/health")
    assert health.status == 200
    data = await health.json()
    assert data["status"] == "ok" and data["n_ctx"] == 2048 and data["parallel"] == 8
    assert data["input_modalities"] == ["text"]  # no --mmproj
    models = await (await client.get("/v1/models")).json()
    assert models["data"][0]["id"] == "gemma-test"


async def test_bad_input_is_4xx_json(client):
    cases = [
        (b"{", "application/json", 422),
        (b'{"model": "\xff"}', "application/json", 400),
        (b"[]", "application/json", 422),
        (json.dumps({"model": "m", "messages": []}).encode(), "application/json", 400),
        (json.dumps(chat(n=0)).encode(), "application/json", 400),
        (json.dumps(chat(max_tokens=-1)).encode(), "application/json", 400),
        (json.dumps(chat(n=10000)).encode(), "application/json", 400),
        (json.dumps(chat(temperature="hot")).encode(), "application/json", 422),
        (b"garbage\x00\x01", "text/plain", 422),
    ]
    for raw, ctype, status in cases:
        resp = await client.post("/v1/chat/completions", data=raw, headers={"Content-Type": ctype})
        assert resp.status == status, (raw, await resp.text())
        assert "detail" in await resp.json()


async def test_second_turn_reuses_the_first_turns_cache(client):
    first = chat(max_tokens=8, temperature=0, logit_bias=EOS_BAN)
    first["messages"] = [{"role": "user", "content": "Name three colours of the rainbow."}]
    one = await (await client.post("/v1/chat/completions", json=first)).json()
    answer = one["choices"][0]["message"]["content"]
    second = {
        **first,
        "messages": [
            *first["messages"],
            {"role": "assistant", "content": answer},
            {"role": "user", "content": "And two more?"},
        ],
    }
    two = await (await client.post("/v1/chat/completions", json=second)).json()
    cached = two["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert one["usage"]["prompt_tokens"] - 1 <= cached < two["usage"]["prompt_tokens"]
    health = await (await client.get("/health")).json()
    assert health["busy_slots"] == 0
