"""The soak: many short, mixed requests against edgeserve, its resident memory sampled as it goes.

PRODUCT.md section 7 asks for memory that stays flat over 1,000 requests. The mix exercises
every path that allocates: streamed and plain chat (n=2 too), legacy completions, scoring, a
stream the client drops after its first chunk, and a bad request. Prompts differ per request,
so the prefix cache keeps turning over. Growth is measured from the sample after the first
WARM_UP_SAMPLES tenths of the requests to the end, after a short idle pause: by then the
once-only growth is behind (caches such as token pieces are full, and llama.cpp's compute
buffers, allocated at load, have had their pages touched by the largest batches; a quick soak
showed +54 MiB within the first fifth, then nothing). The scoring context's output rows are
grown before the first sample (`_score_alone`), since that growth waits on timing.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

import aiohttp

from bench.anchors import EDGESERVE
from bench.load import TIMEOUT, eos_ban, prompt_text

SAMPLES = 10
WARM_UP_SAMPLES = 3
SCORE_KIND = 3  # the score request's place in the mix (_request)


def _request(index: int, eog_ids: Sequence[int]) -> tuple[str, dict[str, Any], str]:
    """(path, body, kind) of request `index` (the model's `eog_ids` banned in its chats): the
    mix cycles through six kinds."""
    prompt = prompt_text(10_000 + index, 12)
    chat = {
        "model": "soak",
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": 4,
        "logit_bias": eos_ban(EDGESERVE, eog_ids),
    }
    kinds: list[tuple[str, dict[str, Any], str]] = [
        ("/v1/chat/completions", chat | {"stream": True}, "stream"),
        ("/v1/chat/completions", chat | {"n": 2}, "chat n=2"),
        ("/v1/completions", {"model": "soak", "prompt": prompt, "max_tokens": 4}, "completion"),
        ("/v1/score/evaluation", {"model": "soak", "messages": [prompt, prompt[:40]]}, "score"),
        ("/v1/chat/completions", chat | {"stream": True, "max_tokens": 64}, "dropped stream"),
        ("/v1/chat/completions", chat | {"messages": []}, "bad request"),
    ]
    return kinds[index % len(kinds)]


async def _one(http: aiohttp.ClientSession, url: str, index: int, eog_ids: Sequence[int]) -> str:
    """Send request `index`; returns "<kind> <status>" (a dropped stream reads one chunk)."""
    path, body, kind = _request(index, eog_ids)
    async with http.post(url + path, json=body) as resp:
        if kind == "dropped stream":
            await resp.content.readany()
            resp.close()
        else:
            await resp.read()
        return f"{kind} {resp.status}"


async def _score_alone(http: aiohttp.ClientSession, url: str, eog_ids: Sequence[int]) -> None:
    """One score request of the mix, alone, before the first sample. Alone in the engine a
    score text decodes in one chunk of all its rows (beside streams, 16 rows a chunk), and
    the scoring context's output buffer grows to the most rows a chunk asked for (a MiB a
    row on a 262k vocabulary): without this, that one-time ~30 MiB came whenever a score
    request first found the engine idle, from the first to the seventh tenth of a
    200-request soak, and read as growth. With it, four soaks of 200 grew -6.8 to -9.2 MiB."""
    path, body, kind = _request(SCORE_KIND, eog_ids)
    assert kind == "score", kind
    async with http.post(url + path, json=body) as resp:
        await resp.read()


async def soak(
    url: str, requests: int, concurrency: int, rss: Callable[[], int], eog_ids: Sequence[int]
) -> dict[str, Any]:
    """Run `requests` requests, `concurrency` at a time (the model's `eog_ids` banned); RSS
    (bytes) sampled SAMPLES times."""
    outcomes: Counter[str] = Counter()
    samples: list[int] = []
    step = max(1, requests // SAMPLES)
    sem = asyncio.Semaphore(concurrency)
    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=connector, timeout=TIMEOUT) as http:

        async def bounded(i: int) -> str:
            async with sem:
                return await _one(http, url, i, eog_ids)

        await _score_alone(http, url, eog_ids)

        for start in range(0, requests, step):
            batch = range(start, min(requests, start + step))
            outcomes.update(await asyncio.gather(*(bounded(i) for i in batch)))
            samples.append(rss())
    await asyncio.sleep(2.0)
    end = rss()
    base = samples[min(WARM_UP_SAMPLES, len(samples)) - 1]
    return {
        "requests": requests,
        "outcomes": dict(sorted(outcomes.items())),
        "rss_samples": samples,
        "rss_base": base,
        "rss_end": end,
        "rss_growth": end - base,
    }
