"""Abuse: what clients that misbehave cost everyone else (PRODUCT.md section 8, issue 11).

Against a running edgeserve, in order:
1. idle CPU after a disconnect: a stream read for 5 chunks and dropped, then the server's CPU
   over IDLE_S seconds with nothing to do (target 0-2% of a core);
2. while one stream runs, three hostile requests at once: a chat of 100,001 short messages
   (~3.7 MB), a score request of 8 texts of 1 MB, and a JSON schema whose nested alternatives
   share their prefixes (llama.cpp's grammar state doubles with each level, so single grammar
   steps take seconds); the stream's longest gap between tokens while they run (target < 1 s);
3. the server still answers /health with 200 afterwards.
"""

from __future__ import annotations

import asyncio
import io
import itertools
import json
import time
from collections.abc import Callable, Sequence
from typing import Any

import aiohttp

from bench.anchors import EDGESERVE
from bench.load import TIMEOUT, eos_ban

IDLE_S = 3.0
SCHEMA_DEPTH = 8


def nested_schema(depth: int) -> dict[str, Any]:
    """Objects nested `depth` deep, each level either {"a": …} or {"a": …, "b": "…"}."""
    node: dict[str, Any] = {"type": "string"}
    for _ in range(depth):
        one = {"type": "object", "properties": {"a": node}, "required": ["a"]}
        two = {
            "type": "object",
            "properties": {"a": node, "b": {"type": "string"}},
            "required": ["a", "b"],
        }
        node = {"anyOf": [one | {"additionalProperties": False}, two]}
    return node


def hostile_bodies() -> list[tuple[str, str, dict[str, Any]]]:
    """(name, path, body) of the three hostile requests."""
    roles = ("user", "assistant")
    many = [{"role": roles[i % 2], "content": "hi"} for i in range(100_001)]
    schema = {"name": "nested", "schema": nested_schema(SCHEMA_DEPTH)}
    return [
        ("100,001 messages", "/v1/chat/completions", {"model": "m", "messages": many}),
        (
            "8 x 1 MB score texts",
            "/v1/score/evaluation",
            {"model": "m", "messages": ["word " * 200_000] * 8},
        ),
        (
            f"schema nested {SCHEMA_DEPTH} deep",
            "/v1/chat/completions",
            {
                "model": "m",
                "messages": [{"role": "user", "content": "Nest the objects."}],
                "max_tokens": 300,
                "temperature": 0,
                "response_format": {"type": "json_schema", "json_schema": schema},
            },
        ),
    ]


def _story(max_tokens: int, eog_ids: Sequence[int]) -> dict[str, Any]:
    """A streamed chat that runs to `max_tokens` (the model's `eog_ids` banned)."""
    return {
        "model": "m",
        "messages": [{"role": "user", "content": "Tell a long story."}],
        "max_tokens": max_tokens,
        "stream": True,
        "logit_bias": eos_ban(EDGESERVE, eog_ids),
    }


async def _stream_gaps(
    session: aiohttp.ClientSession, url: str, stop: asyncio.Event, eog_ids: Sequence[int]
) -> list:
    """Run one long stream until `stop`; the arrival time of each event."""
    times: list[float] = []
    async with session.post(f"{url}/v1/chat/completions", json=_story(4000, eog_ids)) as resp:
        async for line in resp.content:
            if line.startswith(b"data:"):
                times.append(time.perf_counter())
                if stop.is_set():
                    break
    return times


async def _send(session: aiohttp.ClientSession, url: str, path: str, body: Any) -> dict:
    started = time.perf_counter()
    data = io.BytesIO(json.dumps(body).encode())
    headers = {"Content-Type": "application/json"}
    async with session.post(url + path, data=data, headers=headers) as resp:
        await resp.read()
        return {"status": resp.status, "seconds": time.perf_counter() - started}


async def abuse(
    url: str, cpu_seconds: Callable[[], float], eog_ids: Sequence[int]
) -> dict[str, Any]:
    """Run the three checks against edgeserve at `url` (`cpu_seconds`: its CPU time; `eog_ids`:
    its model's end-of-generation tokens)."""
    async with aiohttp.ClientSession(timeout=TIMEOUT) as session:
        resp = await session.post(f"{url}/v1/chat/completions", json=_story(400, eog_ids))
        for _ in range(5):
            await resp.content.readuntil(b"\n\n")
        resp.close()
        await asyncio.sleep(1.0)
        before = cpu_seconds()
        await asyncio.sleep(IDLE_S)
        idle_pct = 100.0 * (cpu_seconds() - before) / IDLE_S

        hostile = hostile_bodies()
        stop = asyncio.Event()
        stream = asyncio.create_task(_stream_gaps(session, url, stop, eog_ids))
        await asyncio.sleep(2.0)
        started = time.perf_counter()
        results = await asyncio.gather(*(_send(session, url, path, b) for _, path, b in hostile))
        ended = time.perf_counter()
        stop.set()
        times = await stream
        during = [b - a for a, b in itertools.pairwise(times) if b >= started and a <= ended]
        before_gaps = [b - a for a, b in itertools.pairwise(times) if b < started]
        async with session.get(f"{url}/health") as health:
            healthy = health.status == 200
    return {
        "idle_cpu_pct_after_disconnect": idle_pct,
        "max_gap_s_before": max(before_gaps, default=None),
        "max_gap_s_during": max(during, default=None),
        "abuse_s": ended - started,
        "hostile": {name: result for (name, _, _), result in zip(hostile, results, strict=True)},
        "healthy_after": healthy,
    }
