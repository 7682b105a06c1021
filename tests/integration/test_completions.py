"""POST /v1/completions (OpenAI's legacy text completions) against the real default model."""

from __future__ import annotations

import json

from tests.integration.conftest import EOS_BAN
from tests.integration.engine_idle import assert_engine_idle, assert_left_work_stops
from tests.integration.sse_client import parse_events

URL = "/v1/completions"
PROMPT = "Once upon a time"


def body(**fields):
    return {"model": "m", "prompt": PROMPT, **fields}


async def post(client, **fields):
    resp = await client.post(URL, json=body(**fields))
    return resp.status, await resp.read()


async def test_non_stream_shape(client):
    status, raw = await post(client, max_tokens=5, temperature=0, logit_bias=EOS_BAN)
    assert status == 200, raw
    data = json.loads(raw)
    assert list(data) == ["id", "object", "created", "model", "choices", "usage"]
    assert data["id"].startswith("cmpl-") and len(data["id"]) == 37
    assert data["object"] == "text_completion" and data["model"] == "m"
    [choice] = data["choices"]
    assert list(choice) == ["text", "index", "logprobs", "finish_reason"]
    assert choice["index"] == 0 and choice["logprobs"] is None
    assert choice["finish_reason"] == "length" and choice["text"]
    usage = data["usage"]
    assert usage["completion_tokens"] == 5
    assert usage["prompt_tokens"] == 5, "BOS + 4 tokens of raw text, no chat template"
    assert usage["total_tokens"] == 10
    assert b": " not in raw.split(b'"text"')[0], "compact JSON"


async def test_default_max_tokens_is_16(client):
    _, raw = await post(client, temperature=0, logit_bias=EOS_BAN)
    assert json.loads(raw)["usage"]["completion_tokens"] == 16


async def test_raw_prompt_is_continued_not_chatted(client):
    """The same text as a chat message gets a template around it; as a prompt it does not."""
    _, raw = await post(client, max_tokens=1, temperature=0)
    chat = await client.post(
        "/v1/chat/completions",
        json={"model": "m", "messages": [{"role": "user", "content": PROMPT}], "max_tokens": 1},
    )
    chat_prompt = (await chat.json())["usage"]["prompt_tokens"]
    assert json.loads(raw)["usage"]["prompt_tokens"] < chat_prompt


async def test_echo_prepends_the_prompt(client):
    fields = {"max_tokens": 4, "temperature": 0, "logit_bias": EOS_BAN}
    _, plain = await post(client, **fields)
    _, echoed = await post(client, **fields, echo=True)
    text = json.loads(plain)["choices"][0]["text"]
    assert json.loads(echoed)["choices"][0]["text"] == PROMPT + text


async def test_list_prompt_and_n_in_openai_order(client):
    prompts = ["The sky is", "Water is"]
    _, raw = await post(
        client, prompt=prompts, n=2, max_tokens=3, echo=True, seed=1, logit_bias=EOS_BAN
    )
    data = json.loads(raw)
    assert [c["index"] for c in data["choices"]] == [0, 1, 2, 3]
    for choice in data["choices"]:
        assert choice["text"].startswith(prompts[choice["index"] // 2])
        assert choice["finish_reason"] == "length"
    usage = data["usage"]
    assert usage["completion_tokens"] == 12
    assert usage["prompt_tokens"] == 4 + 3, "each prompt counted once (BOS + its tokens)"


async def test_stop(client):
    fields = {"max_tokens": 8, "temperature": 0, "logit_bias": EOS_BAN}
    _, raw = await post(client, **fields)
    full = json.loads(raw)["choices"][0]["text"]
    cut = next(i for i in range(1, len(full)) if not full[i].isspace() and full[i] not in full[:i])
    _, raw = await post(client, **fields, stop=full[cut])
    choice = json.loads(raw)["choices"][0]
    assert (choice["text"], choice["finish_reason"]) == (full[:cut], "stop")


async def test_seed_repeats(client):
    fields = {"max_tokens": 8, "temperature": 1.5, "seed": 99, "logit_bias": EOS_BAN}
    first = json.loads((await post(client, **fields))[1])["choices"][0]["text"]
    second = json.loads((await post(client, **fields))[1])["choices"][0]["text"]
    assert first == second


async def test_stream_format_equals_non_stream(client):
    fields = {"max_tokens": 6, "temperature": 0, "logit_bias": EOS_BAN}
    _, raw = await post(client, **fields)
    plain = json.loads(raw)
    resp = await client.post(URL, json=body(**fields, stream=True))
    assert resp.status == 200
    assert resp.headers["Content-Type"] == "text/event-stream; charset=utf-8"
    events, done = parse_events(await resp.read())
    assert done
    assert {e["id"] for e in events} == {events[0]["id"]}
    assert events[0]["id"].startswith("cmpl-")
    assert all(e["object"] == "text_completion" and e["model"] == "m" for e in events)
    assert all(
        list(e["choices"][0]) == ["text", "index", "logprobs", "finish_reason"] for e in events
    )
    assert "".join(e["choices"][0]["text"] for e in events) == plain["choices"][0]["text"]
    finishes = [e["choices"][0]["finish_reason"] for e in events]
    assert finishes == [None] * (len(events) - 1) + ["length"]
    assert all("usage" not in e for e in events)


async def test_stream_echo_usage_and_several_choices(client):
    prompts = ["One", "Two"]
    resp = await client.post(
        URL,
        json=body(
            prompt=prompts,
            n=2,
            max_tokens=3,
            echo=True,
            logit_bias=EOS_BAN,
            stream=True,
            stream_options={"include_usage": True},
        ),
    )
    events, done = parse_events(await resp.read())
    assert done
    usage = events[-1]
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == 12
    texts = {i: "" for i in range(4)}
    finishes: dict[int, list[str]] = {i: [] for i in range(4)}
    for event in events[:-1]:
        [choice] = event["choices"]
        texts[choice["index"]] += choice["text"]
        if choice["finish_reason"]:
            finishes[choice["index"]].append(choice["finish_reason"])
    assert all(texts[i].startswith(prompts[i // 2]) and texts[i] != prompts[i // 2] for i in texts)
    assert finishes == {i: ["length"] for i in range(4)}


async def test_errors_are_json_before_the_stream(client):
    resp = await client.post(URL, json=body(stream=True, suffix="x"))
    assert resp.status == 400
    assert resp.headers["Content-Type"] == "application/json"
    assert "suffix" in (await resp.json())["detail"]


async def test_prompt_too_long_names_the_text(client):
    resp = await client.post(URL, json=body(prompt=["short", "x " * 3000], max_tokens=1))
    assert resp.status == 400
    detail = (await resp.json())["detail"]
    assert detail.startswith('"prompt[1]" is 300') and "context window is 2048 tokens" in detail


async def test_422_and_401(make_client):
    client = await make_client(api_keys=("k",))
    resp = await client.post(URL, json={"model": "m"}, headers={"Authorization": "Bearer k"})
    assert resp.status == 422
    assert (await resp.json())["detail"][0]["loc"] == ["body", "prompt"]
    resp = await client.post(URL, json=body(), headers={"Authorization": "Bearer no"})
    assert resp.status == 401
    assert await resp.json() == {"detail": "Invalid API key.", "message": "Invalid API key."}


async def test_disconnect_leaves_the_engine_idle(client, engine):
    many = body(prompt=["a", "b"], max_tokens=1000, logit_bias=EOS_BAN, stream=True)
    resp = await client.post(URL, json=many)
    # Both prompts generate once each has sent text (the second may join a step later than the
    # first, when its tokenizing outlasts the engine's burst window).
    started: set[int] = set()
    while started != {0, 1}:
        line = await resp.content.readline()
        if line.startswith(b"data: {"):
            started.update(choice["index"] for choice in json.loads(line[6:])["choices"])
    health = await (await client.get("/health")).json()
    assert health["busy_slots"] == 2
    left_at = engine.stats().engine_steps
    resp.close()
    await assert_left_work_stops(engine, left_at)
    await assert_engine_idle(engine)
