"""Embeddings throughput: edgeserve's `/v1/embeddings` (and its baseline's) against
llama-server's `--embeddings`.

Both embed the same batch of short texts (one request of `count` texts) with the same model and
threads, mean pooling, taking turns `rounds` times. llama-server cannot chat while it serves
embeddings, so it runs as a server of its own (`--embeddings --pooling mean`, its `--parallel`
as edgeserve's default 4). Reports texts/s of each (median over the rounds, and each round's),
and the largest cosine distance between each server's vectors and edgeserve's (L2-normalised);
the report gives the ratios.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import aiohttp
import numpy as np

from bench.scoring import make_texts
from bench.turns import rotated

LLAMA_SERVER_ARGS = ("--embeddings", "--pooling", "mean")


async def embed(url: str, texts: list[str]) -> tuple[np.ndarray, float]:
    """The vectors (one row per text, in order) from one request, and the seconds it took."""
    async with aiohttp.ClientSession() as session:
        body = {"model": "bench", "input": texts, "encoding_format": "float"}
        started = time.perf_counter()
        async with session.post(f"{url}/v1/embeddings", json=body) as resp:
            data = await resp.json()
            if resp.status != 200:
                raise RuntimeError(f"embeddings request failed: {resp.status} {data}")
        elapsed = time.perf_counter() - started
    rows = sorted(data["data"], key=lambda item: item["index"])
    return np.asarray([row["embedding"] for row in rows], dtype=np.float64), elapsed


async def compare(pair: list[tuple[str, str]], count: int, words: int, rounds: int) -> dict:
    """Each server in `pair` ((kind, url), ...; the first is the reference) embeds the same
    `count` texts `rounds` times, in turns, after one warm-up request each. Per server: texts/s
    (median, and each round's), and the largest cosine distance to the first one's vectors."""
    texts = make_texts(count, words, seed=1)
    seconds: dict[str, list[float]] = {kind: [] for kind, _ in pair}
    vectors: dict[str, np.ndarray] = {}
    for _kind, url in pair:
        await embed(url, texts[:2])
    for rnd in range(rounds):
        for kind, url in rotated(pair, rnd):
            vectors[kind], elapsed = await embed(url, texts)
            seconds[kind].append(elapsed)
    result: dict[str, Any] = {"texts": count, "words_per_text": words, "rounds": rounds}
    reference = _unit(vectors[pair[0][0]]) if vectors else None
    for kind, times in seconds.items():
        result[kind] = {
            "texts_per_s": count / statistics.median(times),
            "texts_per_s_rounds": [count / t for t in times],
        }
        if reference is not None and kind != pair[0][0]:
            distance = 1.0 - np.sum(reference * _unit(vectors[kind]), axis=1)
            result[kind]["max_cosine_distance"] = float(np.max(distance))
    return result


def _unit(rows: np.ndarray) -> np.ndarray:
    """Each row scaled to length 1."""
    return rows / np.linalg.norm(rows, axis=1, keepdims=True)
