"""The job lifecycle on the real engine and model, through HTTP: a client that goes away at
any stage leaves the engine idle (no steps, no CPU, KV back to the prefix cache), answers do
not depend on the prefix cache, and hostile requests are refused while streams go on.

(Whether choice i of an n>1 request equals a single request with seed + i is checked on the
batch-invariant FakeBackend: llama.cpp's CPU rows vary with their batch, and the reference
samples every n>1 request, at temperature 1 when 0 is asked.)"""

from __future__ import annotations

import asyncio
import io
import json
import uuid
from collections.abc import AsyncIterator
from dataclasses import replace

import pytest

from edgeserve.engine.client import EngineClient
from edgeserve.engine.jobs import prompt_tail
from edgeserve.engine.worker import Engine
from edgeserve.http.app import create_app
from tests.integration.conftest import EOS_BAN
from tests.integration.engine_idle import assert_engine_idle, assert_left_work_stops
from tests.integration.sse_client import finished_stream

CHAT = "/v1/chat/completions"
JSON = {"Content-Type": "application/json"}
# A request left by its client asks for far more tokens than it generates before it is left
# plus STEPS_AFTER_LEAVING: only an abort frees its slot in time (an abort costs no more).
LONG = 1000


def as_file(value) -> io.BytesIO:
    """A large JSON body, streamed (aiohttp warns about big in-memory bodies)."""
    return io.BytesIO(json.dumps(value).encode())


def body(content: str, **fields):
    return {"model": "m", "messages": [{"role": "user", "content": content}], **fields}


async def read_events(resp, count: int) -> None:
    for _ in range(count):
        await resp.content.readuntil(b"\n\n")


async def still_serves(client) -> None:
    resp = await client.post(CHAT, json=body("Say hi.", max_tokens=2, temperature=0))
    assert resp.status == 200
    assert (await resp.json())["usage"]["completion_tokens"] == 2


async def test_disconnect_mid_stream_leaves_the_engine_idle(client, engine):
    resp = await client.post(
        CHAT, json=body("Tell a story.", max_tokens=LONG, logit_bias=EOS_BAN, stream=True)
    )
    await read_events(resp, 5)
    left_at = engine.stats().engine_steps
    resp.close()
    await assert_left_work_stops(engine, left_at)
    await assert_engine_idle(engine)
    await still_serves(client)
    await assert_engine_idle(engine)


async def test_disconnect_mid_tool_call_stream_leaves_the_engine_idle(client, engine):
    # 20 lists of at least 20 numbers (nested, so that the grammar stays small): left to
    # itself the model's call of a story-telling tool is {"story": "dragon"}, 20 tokens.
    row = {"type": "array", "items": {"type": "integer"}, "minItems": 20}
    rows = {"type": "array", "items": row, "minItems": 20}
    numbers = {"type": "object", "properties": {"rows": rows}, "required": ["rows"]}
    tool = {"type": "function", "function": {"name": "count", "parameters": numbers}}
    request = body(
        "Count in rows.",
        tools=[tool],
        tool_choice="required",
        max_tokens=LONG,
        temperature=0,
        stream=True,
    )
    resp = await client.post(CHAT, json=request)
    await read_events(resp, 4)  # the role, the call's start, two pieces of its arguments
    assert engine.stats().busy_slots == 1, "the call is still being generated"
    left_at = engine.stats().engine_steps
    resp.close()
    await assert_left_work_stops(engine, left_at)
    await assert_engine_idle(engine)
    await still_serves(client)


async def test_disconnect_of_a_non_stream_request_leaves_the_engine_idle(client, engine):
    task = asyncio.create_task(
        client.post(CHAT, json=body("Count.", max_tokens=LONG, logit_bias=EOS_BAN))
    )
    while engine.stats().busy_slots == 0:
        await asyncio.sleep(0.01)
    left_at = engine.stats().engine_steps
    task.cancel()
    await assert_left_work_stops(engine, left_at)
    await assert_engine_idle(engine)


async def test_disconnect_mid_prefill_while_another_request_waits(client, engine):
    # A stream runs, so a long prompt prefills in 64-token chunks over many steps. Cancel it
    # mid-prefill while a request sharing its prefix is being admitted: both must leave the KV
    # cache consistent (the exact takeover of the freed sequence, and that the answer does not
    # change, are checked bit for bit on FakeBackend; here the batches differ between runs).
    stream = await client.post(
        CHAT, json=body("Go on.", max_tokens=LONG, logit_bias=EOS_BAN, stream=True)
    )
    await read_events(stream, 2)
    long = f"{uuid.uuid4()} " + "The history of the river and its bridges. " * 120
    doomed = asyncio.create_task(client.post(CHAT, json=body(long, max_tokens=4)))
    while engine.stats().busy_slots < 2:
        await asyncio.sleep(0.005)
    waiter_body = body(long + " Summarise.", max_tokens=6, temperature=0, logit_bias=EOS_BAN)
    waiter = asyncio.create_task(client.post(CHAT, json=waiter_body))
    await asyncio.sleep(0.05)
    doomed.cancel()
    answer = await (await waiter).json()
    assert answer["usage"]["completion_tokens"] == 6
    left_at = engine.stats().engine_steps
    stream.close()
    await assert_left_work_stops(engine, left_at)
    await assert_engine_idle(engine)
    again = await (await client.post(CHAT, json=waiter_body)).json()
    assert again["usage"]["prompt_tokens_details"]["cached_tokens"] > 0
    assert again["usage"]["completion_tokens"] == 6
    await assert_engine_idle(engine)


async def test_disconnect_while_queued(client, engine):
    streams = []
    for i in range(8):  # the session engine runs 8 sequences
        resp = await client.post(
            CHAT, json=body(f"Story {i}.", max_tokens=LONG, logit_bias=EOS_BAN, stream=True)
        )
        await read_events(resp, 1)
        streams.append(resp)
    queued = asyncio.create_task(client.post(CHAT, json=body("Wait.", max_tokens=4)))
    while engine.stats().queue_length == 0:
        await asyncio.sleep(0.01)
    queued.cancel()
    left_at = engine.stats().engine_steps
    for resp in streams:
        resp.close()
    await assert_left_work_stops(engine, left_at)
    await assert_engine_idle(engine)
    await still_serves(client)


@pytest.fixture
def fresh_engine(engine):
    """A second engine on the same model (~2 s to load) whose KV cache no other test has
    used: llama.cpp's CPU results depend on where a sequence's cells sit in the cache (sums
    run in cell order), so answers are comparable bit for bit only where no earlier traffic
    has fragmented it."""
    eng = Engine(replace(engine.config, parallel=4, n_ctx=1024))
    eng.start()
    assert eng.wait_loaded(120), eng.load_error
    yield eng
    eng.close()


@pytest.fixture
async def fresh(aiohttp_client, fresh_engine, settings) -> AsyncIterator[object]:
    return await aiohttp_client(create_app(settings, EngineClient(fresh_engine)))


async def test_cold_and_warm_answers_are_the_same_at_temperature_zero(fresh, fresh_engine):
    # The warm request decodes the prompt's last tokens again, as the cold one decoded them
    # apart (Prompt.tail: one, or more where the backend's row_multiple asks for them), until
    # prompts of two tail sizes have been asked (of one, where every tail is one token).
    client, engine = fresh, fresh_engine
    rows = engine.backend.row_multiple
    tails: set[int] = set()
    for _ in range(12):
        prompt = body(
            f"{uuid.uuid4()} Name a colour.", max_tokens=10, temperature=0, logit_bias=EOS_BAN
        )
        cold = await (await client.post(CHAT, json=prompt)).json()
        warm = await (await client.post(CHAT, json=prompt)).json()
        n_prompt = cold["usage"]["prompt_tokens"]
        cold_cached = (cold["usage"].get("prompt_tokens_details") or {}).get("cached_tokens", 0)
        assert cold_cached < 8  # at most the chat template's opening is shared with others
        tail = prompt_tail(n_prompt, rows)
        assert warm["usage"]["prompt_tokens_details"]["cached_tokens"] == n_prompt - tail
        assert warm["choices"][0]["message"] == cold["choices"][0]["message"]
        tails.add(tail)
        if len(tails) == min(rows, 2):
            break
    assert len(tails) == min(rows, 2)
    await assert_engine_idle(engine)


async def test_hostile_requests_are_refused_and_running_streams_go_on(client, engine):
    stream = await client.post(
        CHAT, json=body("Go on.", max_tokens=60, logit_bias=EOS_BAN, stream=True)
    )
    await read_events(stream, 2)
    many = {"model": "m", "messages": [{"role": "user", "content": "hi"}] * 100_001}
    many["messages"][1::2] = [{"role": "assistant", "content": "ok"}] * 50_000
    huge_score = {"model": "m", "messages": ["word " * 200_000] * 8}
    resp_many, resp_score = await asyncio.gather(
        client.post(CHAT, data=as_file(many), headers=JSON),
        client.post("/v1/score/evaluation", data=as_file(huge_score), headers=JSON),
    )
    assert resp_many.status == 400 and "at least" in (await resp_many.json())["detail"]
    assert resp_score.status == 400 and "messages[0]" in (await resp_score.json())["detail"]
    _, reason = finished_stream(await stream.read())
    assert reason == "length", "the stream ran to max_tokens"
    await assert_engine_idle(engine)
