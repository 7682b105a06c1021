"""Scoring throughput: edgeserve's `/v1/score/evaluation` (and its baseline's) against a plain
Llama loop.

Both score the same texts with the same model and threads. The loop is the straightforward
way: `Llama(logits_all=True)`, every logit row of a text, a float64 log-softmax in numpy, the
mean log-probability of the text's tokens (each given all before it, after BOS). Reports
texts/s of each, their ratio (PRODUCT.md section 7 asks for at least 2x) and the largest
absolute score difference (at most 1e-3).
"""

from __future__ import annotations

import random
import statistics
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np

from bench.turns import rotated

# Passes each server makes over the texts, the servers taking turns (the first rotating): a
# server's texts/s is its median pass. One pass each, edgeserve always first, once read two
# releases 19% apart where 8 alternated requests put them within 8%.
PASSES = 3

WORDS = (
    "the model reads a sentence and every token is scored given all the tokens before it "
    "while the server keeps answering chat requests on the same machine"
).split()


def make_texts(count: int, words: int, seed: int = 0) -> list[str]:
    """Reproducible pseudo-sentences of about `words` words."""
    rng = random.Random(seed)
    return [
        " ".join(rng.choice(WORDS) for _ in range(words)).capitalize() + "." for _ in range(count)
    ]


def loop_scores(llm: Any, texts: list[str]) -> list[float]:
    """The straightforward way: full logits per text, log-softmax in float64."""
    out = []
    for text in texts:
        tokens = llm.tokenize(text.encode(), add_bos=True, special=False)
        llm.reset()
        llm.eval(tokens)
        logits = np.asarray(llm.scores[: len(tokens) - 1], dtype=np.float64)
        logits -= logits.max(axis=1, keepdims=True)
        logsm = logits - np.log(np.exp(logits).sum(axis=1, keepdims=True))
        out.append(float(logsm[np.arange(len(tokens) - 1), tokens[1:]].mean()))
    return out


async def server_scores(url: str, texts: list[str]) -> tuple[list[float], float]:
    """Scores from the server in one request, and the seconds it took."""
    async with aiohttp.ClientSession() as session:
        body = {"model": "bench", "messages": texts}
        started = time.perf_counter()
        async with session.post(f"{url}/v1/score/evaluation", json=body) as resp:
            data = await resp.json()
            if resp.status != 200:
                raise RuntimeError(f"score request failed: {resp.status} {data}")
        return [float(s) for s in data["scores"]], time.perf_counter() - started


async def compare(
    servers: list[tuple[str, str]], model: Path, threads: int, count: int, words: int
) -> dict[str, Any]:
    """Score `count` texts on each server (kind, url), PASSES times in turns after one
    warm-up text each, and with the loop; per server: texts/s (its median pass), the ratio
    to the loop, the max diff over every pass."""
    from llama_cpp import Llama  # the bench venv's llama-cpp-python: the same wheel

    texts = make_texts(count, words)
    for _kind, url in servers:
        await server_scores(url, texts[:1])
    answers = await scored_in_turns(servers, texts, PASSES)
    llm = Llama(str(model), logits_all=True, n_ctx=512, n_threads=threads, verbose=False)
    try:
        loop_scores(llm, texts[:1])
        started = time.perf_counter()
        reference = loop_scores(llm, texts)
        loop_s = time.perf_counter() - started
        n_tokens = sum(len(llm.tokenize(t.encode(), add_bos=True)) for t in texts)
    finally:
        llm.close()
    result: dict[str, Any] = {
        "texts": count,
        "tokens_per_text": n_tokens / count,
        "loop_texts_per_s": count / loop_s,
    }
    for kind, (passes, seconds) in answers.items():
        result[kind] = {
            "texts_per_s": count / seconds,
            "ratio": loop_s / seconds,
            "max_abs_diff": max(
                abs(a - b) for scores in passes for a, b in zip(scores, reference, strict=True)
            ),
        }
    return result


async def scored_in_turns(
    servers: Sequence[tuple[str, str]],
    texts: list[str],
    passes: int,
    score: Callable[[str, list[str]], Awaitable[tuple[list[float], float]]] = server_scores,
) -> dict[str, tuple[list[list[float]], float]]:
    """Per server (kind, url): the scores of each of `passes` passes over `texts` and the
    median seconds of a pass, the servers taking turns pass by pass, the first rotating."""
    scores: dict[str, list[list[float]]] = {kind: [] for kind, _ in servers}
    seconds: dict[str, list[float]] = {kind: [] for kind, _ in servers}
    for turn in range(passes):
        for kind, url in rotated(servers, turn):
            got, took = await score(url, texts)
            scores[kind].append(got)
            seconds[kind].append(took)
    return {kind: (scores[kind], statistics.median(seconds[kind])) for kind in scores}
