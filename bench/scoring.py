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
import time
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np

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
    """Score `count` texts on each server (kind, url), in turns after one warm-up text each,
    and with the loop; per server: texts/s, the ratio to the loop, the max diff."""
    from llama_cpp import Llama  # the bench venv's llama-cpp-python: the same wheel

    texts = make_texts(count, words)
    for _kind, url in servers:
        await server_scores(url, texts[:1])
    answers = {kind: await server_scores(url, texts) for kind, url in servers}
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
    for kind, (scores, seconds) in answers.items():
        result[kind] = {
            "texts_per_s": count / seconds,
            "ratio": loop_s / seconds,
            "max_abs_diff": max(abs(a - b) for a, b in zip(scores, reference, strict=True)),
        }
    return result
