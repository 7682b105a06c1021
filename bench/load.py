"""The streaming load: concurrent chat completions over SSE, and what they measured.

Every request asks for exactly `max_tokens` tokens: the model's end-of-generation tokens
(`bench.models.read_model`) are banned, each server in its own way, so a stream that ends
earlier, without a `finish_reason`, or without `[DONE]` was cut short. Prompts differ per
request and round (no server gets a prompt-cache hit across requests) but are the same for
every server.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import random
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import aiohttp

from bench.anchors import LLAMA_SERVER, Server, Servers
from bench.engine_clock import EngineClocks
from bench.turns import rotated

TIMEOUT = aiohttp.ClientTimeout(total=900, sock_read=300)


WORDS = (
    "river stone lantern harbor winter garden signal copper meadow thunder orchard window "
    "market engine silver forest letter bridge candle mountain island shadow village ribbon "
    "compass canyon feather harvest journey marble needle ocean pepper quiet rocket saddle"
).split()


def eos_ban(kind: str, eog_ids: Sequence[int]) -> Any:
    """The `logit_bias` that bans the model's EOG tokens: llama-server's [[id, false]] form,
    else OpenAI's."""
    if kind == LLAMA_SERVER:
        return [[t, False] for t in eog_ids]
    return {str(t): -100 for t in eog_ids}


def prompt_text(index: int, words: int) -> str:
    """A reproducible prompt of about `words` words, different for every `index`."""
    rng = random.Random(index)
    body = " ".join(rng.choice(WORDS) for _ in range(words))
    return f"Story {index}. Continue this list of words with a long story: {body}."


ATTEMPT_STRIDE = 100_000_000


def load_prompt_index(
    rnd: int, concurrency: int, request: int, worker: int, sampled: bool, attempt: int = 0
) -> int:
    """The prompt of one load request: new for every round, level, request, worker, greedy or
    sampled run, and attempt (a noisy run done again must not hit the prompts the first try
    cached); apart from the other workloads' prompts, the same for every server."""
    index = 100_000 * (rnd + 1) + 1000 * concurrency + request * concurrency + worker
    return index + (50_000 if sampled else 0) + ATTEMPT_STRIDE * attempt


def session(limit: int = 10) -> aiohttp.ClientSession:
    """A client session that opens a fresh connection per request: llama-server closes
    keep-alive connections after a stream, and every server should pay the same."""
    connector = aiohttp.TCPConnector(limit=limit, force_close=True)
    return aiohttp.ClientSession(connector=connector, timeout=TIMEOUT)


def chat_body(
    kind: str,
    messages: list[dict[str, Any]],
    max_tokens: int,
    eog_ids: Sequence[int],
    temperature: float = 0.0,
    seed: int | None = None,
) -> dict[str, Any]:
    """A streaming chat request that generates exactly `max_tokens` tokens (the model's
    `eog_ids` banned): greedy, or at `temperature` with the server's other sampling defaults
    (what a user sends) and `seed`."""
    seeded = {} if seed is None else {"seed": seed}
    return seeded | {
        "model": "bench",
        "messages": messages,
        "max_tokens": max_tokens,
        "temperature": temperature,
        "logit_bias": eos_ban(kind, eog_ids),
        "stream": True,
        "stream_options": {"include_usage": True},
    }


@dataclass
class Stream:
    """What one streamed request saw (times in seconds)."""

    tokens: int = 0
    chunks: int = 0
    ttft: float | None = None
    decode_tps: float | None = None
    gaps: list[float] = field(default_factory=list)
    text: str = ""
    finish_reason: str | None = None
    done: bool = False
    prompt_tokens: int | None = None
    cached_tokens: int | None = None
    error: str | None = None
    short: bool = True


async def stream_chat(http: aiohttp.ClientSession, url: str, body: dict[str, Any]) -> Stream:
    """POST one streamed chat completion and time its content chunks."""
    out = Stream()
    stamps: list[float] = []
    usage: dict[str, Any] | None = None
    timings: dict[str, Any] | None = None
    parts: list[str] = []
    started = time.perf_counter()
    try:
        async with http.post(f"{url}/v1/chat/completions", json=body) as resp:
            if resp.status != 200:
                out.error = f"HTTP {resp.status}: {(await resp.text())[:200]}"
                return out
            async for raw in resp.content:
                if not raw.startswith(b"data: "):
                    continue
                data = raw[6:].strip()
                if data == b"[DONE]":
                    out.done = True
                    break
                chunk = json.loads(data)
                usage = chunk.get("usage") or usage
                timings = chunk.get("timings") or timings
                for choice in chunk.get("choices") or ():
                    content = (choice.get("delta") or {}).get("content")
                    if content:
                        stamps.append(time.perf_counter())
                        parts.append(content)
                    out.finish_reason = choice.get("finish_reason") or out.finish_reason
    except (aiohttp.ClientError, TimeoutError, json.JSONDecodeError) as exc:
        out.error = f"{type(exc).__name__}: {exc}"
    out.text = "".join(parts)
    out.chunks = len(stamps)
    if usage:
        out.tokens = int(usage.get("completion_tokens") or 0)
        out.prompt_tokens = usage.get("prompt_tokens")
        details = usage.get("prompt_tokens_details") or {}
        out.cached_tokens = details.get("cached_tokens")
    elif out.finish_reason == "length":
        out.tokens = body["max_tokens"]
    else:
        out.tokens = out.chunks
    if out.cached_tokens is None and timings and "cache_n" in timings:
        out.cached_tokens = int(timings["cache_n"])
    if stamps:
        out.ttft = stamps[0] - started
        out.gaps = [b - a for a, b in itertools.pairwise(stamps)]
        if len(stamps) > 1 and stamps[-1] > stamps[0]:
            # Tokens after the first over the time they took (decode speed, no prefill).
            out.decode_tps = (max(out.tokens, out.chunks) - 1) / (stamps[-1] - stamps[0])
    out.short = (
        out.error is not None
        or not out.done
        or out.finish_reason is None
        or out.tokens < body["max_tokens"]
    )
    return out


def pct(values: list[float], q: float) -> float | None:
    """The q-quantile (0..1) by linear interpolation; None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q
    lo = int(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


@dataclass
class RunResult:
    """One load run against one server at one concurrency."""

    server: str
    concurrency: int
    requests: int
    wall_s: float
    tokens: int
    aggregate_tps: float
    stream_tps_p50: float | None
    ttft_p50_ms: float | None
    ttft_p95_ms: float | None
    itl_p50_ms: float | None
    itl_p99_ms: float | None
    itl_max_ms: float | None
    short: int
    errors: list[str]
    prompt_tokens_p50: float | None
    server_cpu_s: float = 0.0
    other_cpu_s: float = 0.0
    # edgeserve's engine thread over the run (its /metrics): milliseconds a step in each
    # phase, outside llama_decode in all (its own work) and waiting for the event loops to
    # send (None for the other servers)
    engine_phases_ms: dict[str, float] | None = None
    engine_step_ms: float | None = None
    loop_wait_ms: float | None = None

    def to_json(self) -> dict[str, Any]:
        """A plain dict for the JSON report."""
        return asdict(self)


def summarize(server: str, concurrency: int, streams: list[Stream], wall: float) -> RunResult:
    """Aggregate the streams of one run."""
    ms = 1000.0
    ttfts = [s.ttft * ms for s in streams if s.ttft is not None]
    gaps = [g * ms for s in streams for g in s.gaps]
    rates = [s.decode_tps for s in streams if s.decode_tps is not None]
    prompts = [float(s.prompt_tokens) for s in streams if s.prompt_tokens is not None]
    tokens = sum(s.tokens for s in streams)
    return RunResult(
        server=server,
        concurrency=concurrency,
        requests=len(streams),
        wall_s=wall,
        tokens=tokens,
        aggregate_tps=tokens / wall if wall > 0 else 0.0,
        stream_tps_p50=statistics.median(rates) if rates else None,
        ttft_p50_ms=pct(ttfts, 0.5),
        ttft_p95_ms=pct(ttfts, 0.95),
        itl_p50_ms=pct(gaps, 0.5),
        itl_p99_ms=pct(gaps, 0.99),
        itl_max_ms=max(gaps) if gaps else None,
        short=sum(s.short for s in streams),
        errors=[s.error for s in streams if s.error][:5],
        prompt_tokens_p50=statistics.median(prompts) if prompts else None,
    )


@dataclass(frozen=True)
class LoadShape:
    """What each request of a load run asks: `max_tokens` tokens after a prompt of about
    `prompt_words` words (`load_prompt_index`'s for round `rnd` and try `attempt`), greedy or
    at `temperature` with a seed per request (the same everywhere), `eog_ids` banned."""

    max_tokens: int
    prompt_words: int
    eog_ids: Sequence[int]
    rnd: int = 0
    temperature: float = 0.0
    attempt: int = 0

    def body(self, kind: str, concurrency: int, request: int, worker: int) -> dict[str, Any]:
        """The chat request `worker` of a run at `concurrency` sends `request`-th, for a
        server of `kind`."""
        sampled = self.temperature > 0
        index = load_prompt_index(self.rnd, concurrency, request, worker, sampled, self.attempt)
        messages = [{"role": "user", "content": prompt_text(index, self.prompt_words)}]
        seed = index if sampled else None
        return chat_body(kind, messages, self.max_tokens, self.eog_ids, self.temperature, seed)


async def run_load(
    url: str, kind: str, concurrency: int, per_worker: int, shape: LoadShape
) -> RunResult:
    """`concurrency` workers each stream `per_worker` requests of `shape` back to back
    (closed loop).

    Prompts are `load_prompt_index`'s: a later run or a retried one never hits a prompt cache
    filled by an earlier one (llama-server keeps past prompts in RAM), and every server gets
    the same prompts in the same run."""
    streams: list[Stream] = []

    async def worker(w: int, http: aiohttp.ClientSession) -> None:
        for r in range(per_worker):
            streams.append(await stream_chat(http, url, shape.body(kind, concurrency, r, w)))

    async with session(concurrency + 2) as http:
        clocks = EngineClocks(http, [(kind, url)])
        await clocks.start()
        started = time.perf_counter()
        await asyncio.gather(*(worker(w, http) for w in range(concurrency)))
        wall = time.perf_counter() - started
        run = summarize(kind, concurrency, streams, wall)
        await clocks.stamp([run])
    return run


async def run_in_turns(
    servers: Sequence[Server], requests: int, shape: LoadShape
) -> list[RunResult]:
    """One stream at a time, the servers taking turns request by request (the same prompt
    for each, the first server rotating), `requests` of `shape` each: a change in the
    machine's speed during the round falls on every server alike, where runs one server after
    the other measured its slow and fast spells (one round saw llama-server at 106 and 122
    tok/s). Each server's requests are summarized as `run_load`'s are at concurrency 1: its
    wall time and CPU are those of its own requests."""
    streams: dict[str, list[Stream]] = {s.kind: [] for s in servers}
    walls = dict.fromkeys(streams, 0.0)
    cpus = dict.fromkeys(streams, 0.0)
    async with session(2) as http:
        clocks = EngineClocks(http, [(s.kind, s.url) for s in servers])
        await clocks.start()
        for r in range(requests):
            for server in rotated(servers, r):
                body = shape.body(server.kind, 1, r, 0)
                cpu, started = server.cpu(), time.perf_counter()
                streams[server.kind].append(await stream_chat(http, server.url, body))
                walls[server.kind] += time.perf_counter() - started
                cpus[server.kind] += server.cpu() - cpu
        runs = []
        for kind, done in streams.items():
            run = summarize(kind, 1, done, walls[kind])
            run.server_cpu_s = cpus[kind]
            runs.append(run)
        await clocks.stamp(runs)
    return runs


async def warm_up(url: str, kind: str, prompt_words: int, eog_ids: Sequence[int]) -> Stream:
    """One short request with a bench-sized prompt, so that lazy initialisation is not
    measured; its `prompt_tokens` tells the prompt size."""
    async with session() as http:
        messages = [{"role": "user", "content": prompt_text(0, prompt_words)}]
        return await stream_chat(http, url, chat_body(kind, messages, 4, eog_ids))


async def rss_after_one_chat(
    servers: Servers,
    kinds: Sequence[str],
    parallel: int,
    extra: Callable[[str], tuple[str, ...]],
    prompt_words: int,
    eog_ids: Sequence[int],
) -> dict[str, dict[str, int]]:
    """Start each of `kinds` at once with `parallel` sequences and `extra(kind)` arguments, send
    each one short chat (`warm_up`), wait a second, read each one's memory (`proc_status`:
    VmRSS, VmHWM, ...) and stop it."""
    running = [servers.start(kind, parallel, extra(kind)) for kind in kinds]
    await asyncio.gather(*(servers.wait_ready(s) for s in running))
    for server in running:
        await warm_up(server.url, server.kind, prompt_words, eog_ids)
    await asyncio.sleep(1.0)
    found = {}
    for server in running:
        found[server.kind] = server.rss()
        servers.stop(server)
    return found


@dataclass
class MultiTurn:
    """TTFT of a conversation's first turn and of its second (which re-sends the first)."""

    server: str
    conversations: int
    ttft1_p50_ms: float | None
    ttft2_p50_ms: float | None
    prompt1_tokens: float | None
    prompt2_tokens: float | None
    cached2_tokens: float | None
    short: int
    errors: list[str]

    def to_json(self) -> dict[str, Any]:
        """A plain dict for the JSON report."""
        return asdict(self)


async def two_turns(
    url: str, kind: str, index: int, prompt_words: int, answer_tokens: int, eog_ids: Sequence[int]
) -> tuple[Stream, Stream]:
    """One two-turn chat: turn 2 = turn 1's message + its answer + a short question."""
    async with session() as http:
        history = [{"role": "user", "content": prompt_text(5000 + index, prompt_words)}]
        first = await stream_chat(http, url, chat_body(kind, history, answer_tokens, eog_ids))
        history += [
            {"role": "assistant", "content": first.text},
            {"role": "user", "content": "Now tell the same story in three short lines."},
        ]
        second = await stream_chat(http, url, chat_body(kind, history, 8, eog_ids))
    return first, second


def summarize_turns(kind: str, pairs: list[tuple[Stream, Stream]]) -> MultiTurn:
    """Medians over the conversations."""

    def median(values: list[float | int | None], scale: float = 1.0) -> float | None:
        present = [float(v) for v in values if v is not None]
        return statistics.median(present) * scale if present else None

    return MultiTurn(
        server=kind,
        conversations=len(pairs),
        ttft1_p50_ms=median([a.ttft for a, _ in pairs], 1000.0),
        ttft2_p50_ms=median([b.ttft for _, b in pairs], 1000.0),
        prompt1_tokens=median([a.prompt_tokens for a, _ in pairs]),
        prompt2_tokens=median([b.prompt_tokens for _, b in pairs]),
        cached2_tokens=median([b.cached_tokens for _, b in pairs]),
        short=sum(a.short + b.short for a, b in pairs),
        errors=[s.error for pair in pairs for s in pair if s.error][:5],
    )
