"""Grounded work: answers that rewrite or quote a passage the prompt carries.

Copying, quoting, extracting and light rewriting repeat long stretches of the prompt, which is
what n-gram speculation drafts from. Each prompt below carries a passage and asks for such an
answer; every server answers each prompt greedily (`temperature` 0, 128 tokens at most),
streamed, taking turns (edgeserve's baseline, when the bench has one, with and without
speculation like edgeserve). At c=1 one request runs at a time; at c=4 the four prompts run side by
side. Reported per server: decode tokens/s (completion tokens after the first over the time
after the first token; at c=4 all streams' tokens over the wall time), and how many answers
differ from the same server's answers without speculation (greedy answers can change at
near-ties, since llama.cpp's kernels give slightly different logits for different batch
shapes).
"""

from __future__ import annotations

import asyncio
import json
import statistics
import time
from typing import Any

import aiohttp

from bench.anchors import LLAMA_SERVER
from bench.turns import rotated

PASSAGE_HARBOUR = (
    "The lighthouse at the end of the harbour was built in 1852 from granite quarried on the "
    "island. Its lamp burned whale oil until 1890, then paraffin, and since 1954 it has been "
    "electric. Three keepers lived there in turns, and the last of them left in 1987 when the "
    "light was automated. The tower is 31 metres tall and its beam reaches 22 nautical miles."
)
PASSAGE_CODE = (
    "def parse_config(path):\n"
    "    with open(path) as f:\n"
    "        lines = f.read().splitlines()\n"
    "    config = {}\n"
    "    for line in lines:\n"
    "        if not line or line.startswith('#'):\n"
    "            continue\n"
    "        key, value = line.split('=', 1)\n"
    "        config[key.strip()] = value.strip()\n"
    "    return config\n"
)
PASSAGE_MINUTES = (
    "Minutes of the meeting of 4 March. Present: Anna Berg, Tom Illic, Sara Quist. The budget "
    "for the new roof was approved at 48,000 euros. Work starts on 2 May and must end before "
    "the summer festival on 21 June. Tom Illic will ask three builders for quotes by 1 April. "
    "Sara Quist will inform the tenants by letter. The next meeting is on 8 April at 18:00."
)
PROMPTS = (
    f"{PASSAGE_HARBOUR}\n\nCopy the passage above exactly, word for word.",
    f"{PASSAGE_CODE}\nRewrite this function with type hints added. Change nothing else.",
    f"{PASSAGE_MINUTES}\n\nQuote every sentence of these minutes that contains a date.",
    f"{PASSAGE_HARBOUR}\n\nRepeat the text above, then say in one sentence what it is about.",
)
MAX_TOKENS = 128
# llama-server's speculation variants: none, then the ngram kinds the issue measured.
LLAMA_SERVER_SPEC = {
    "llama-server": (),
    "llama-server ngram-simple": ("--spec-type", "ngram-simple"),
    "llama-server ngram-mod": ("--spec-type", "ngram-mod"),
}
NO_SPEC = "no-spec"


def edgeserve_spec(kind: str) -> dict[str, tuple[str, ...]]:
    """An edgeserve's variants (`kind`: edgeserve or its baseline): as it is, and without
    speculation."""
    return {kind: (), no_spec(kind): ("--draft-max", "0")}


def no_spec(kind: str) -> str:
    """The label of `kind`'s variant without speculation (llama-server's is plain)."""
    return kind if kind == LLAMA_SERVER else f"{kind} {NO_SPEC}"


def kind_of(label: str) -> str:
    """The server kind of a variant's label ("edgeserve-baseline no-spec": edgeserve-baseline)."""
    return label.split(" ", 1)[0]


def body(prompt: str) -> dict[str, Any]:
    """A greedy streamed chat request (the same for every server)."""
    return {
        "model": "bench",
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": MAX_TOKENS,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }


async def stream(http: aiohttp.ClientSession, url: str, prompt: str) -> dict[str, Any]:
    """One streamed answer: its text, tokens, and the times of its first and last token."""
    started = time.perf_counter()
    first = last = None
    text, tokens = "", 0
    async with http.post(f"{url}/v1/chat/completions", json=body(prompt)) as resp:
        if resp.status != 200:
            raise RuntimeError(f"grounded request failed: {resp.status} {await resp.text()}")
        async for raw in resp.content:
            line = raw.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line.removeprefix("data: "))
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
            for choice in chunk.get("choices", []):
                piece = (choice.get("delta") or {}).get("content")
                if piece:
                    now = time.perf_counter()
                    first = first or now
                    last = now
                    text += piece
    first = first or time.perf_counter()
    return {"text": text, "tokens": tokens, "start": started, "first": first, "last": last or first}


async def level(servers: list[tuple[str, str]], concurrency: int, rounds: int) -> dict[str, Any]:
    """Every server answers every prompt `rounds` times, taking turns; `concurrency` prompts
    at once. Per server: median decode tokens/s per prompt (c=1) or aggregate (c>1), the
    same per round, and the answers of the last round."""
    rates: dict[str, list[list[float]]] = {kind: [] for kind, _ in servers}
    texts: dict[str, list[str]] = {}
    timeout = aiohttp.ClientTimeout(total=900)
    # A connection each (llama-server closes idle keep-alive connections after 5 s).
    connector = aiohttp.TCPConnector(force_close=True)
    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as http:
        for _kind, url in servers:
            await stream(http, url, PROMPTS[0][:200])
        for rnd in range(rounds):
            for kind, url in rotated(servers, rnd):
                if concurrency == 1:
                    done = [await stream(http, url, p) for p in PROMPTS]
                    rates[kind].append([rate(d) for d in done])
                else:
                    started = time.perf_counter()
                    done = await asyncio.gather(*(stream(http, url, p) for p in PROMPTS))
                    wall = max(d["last"] for d in done) - started
                    rates[kind].append([sum(d["tokens"] for d in done) / wall])
                texts[kind] = [d["text"] for d in done]
    out: dict[str, Any] = {}
    for kind, per_round in rates.items():
        columns = list(zip(*per_round, strict=True))
        out[kind] = {
            "tok_s": [statistics.median(c) for c in columns],
            "tok_s_rounds": per_round,
            "texts": texts[kind],
        }
    return out


def rate(done: dict[str, Any]) -> float:
    """Decode tokens/s of one answer: tokens after the first over the time after the first."""
    span = done["last"] - done["first"]
    return (done["tokens"] - 1) / span if span > 0 and done["tokens"] > 1 else 0.0


def differing(results: dict[str, Any], kind: str, baseline: str) -> int | None:
    """How many of `kind`'s answers differ from `baseline`'s (None if either is missing)."""
    if kind not in results or baseline not in results:
        return None
    pairs = zip(results[kind]["texts"], results[baseline]["texts"], strict=True)
    return sum(a != b for a, b in pairs)
