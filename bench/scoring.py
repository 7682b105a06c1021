"""Scoring throughput: edgeserve's engine against a straightforward Llama(logits_all=True) loop.

    python -m bench.scoring [--model GGUF] [--texts 64] [--threads 2]

Both score the same texts (about 100 tokens each) with the same model and threads; the loop
computes every logit row with llama-cpp-python and a float64 log-softmax in numpy. Prints
texts/s for each, the ratio, and the largest absolute score difference.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import time

import numpy as np
from llama_cpp import Llama

from edgeserve.engine.client import EngineClient
from edgeserve.engine.scheduler import Engine
from edgeserve.engine.types import EngineConfig, ScoreRequest

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


def loop_scores(llm: Llama, texts: list[str]) -> list[float]:
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", default="models/gemma-3-270m-q4_k_m.gguf")
    parser.add_argument("--texts", type=int, default=64)
    parser.add_argument("--words", type=int, default=80)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    texts = make_texts(args.texts, args.words)

    engine = Engine(EngineConfig(model_path=args.model, n_threads=args.threads, parallel=4))
    engine.start()
    engine.wait_loaded()
    client = EngineClient(engine)
    asyncio.run(client.score(ScoreRequest(tuple(texts[:2]))))
    started = time.perf_counter()
    result = asyncio.run(client.score(ScoreRequest(tuple(texts))))
    ours_s = time.perf_counter() - started
    engine.close()
    tokens = result.n_tokens

    llm = Llama(args.model, logits_all=True, n_ctx=512, n_threads=args.threads, verbose=False)
    loop_scores(llm, texts[:2])
    started = time.perf_counter()
    reference = loop_scores(llm, texts)
    loop_s = time.perf_counter() - started
    llm.close()

    diff = max(abs(a - b) for a, b in zip(result.scores, reference, strict=True))
    print(f"{args.texts} texts, {tokens / args.texts:.0f} tokens each on average")
    print(f"edgeserve engine: {args.texts / ours_s:.2f} texts/s ({ours_s:.2f} s)")
    print(f"Llama(logits_all) loop: {args.texts / loop_s:.2f} texts/s ({loop_s:.2f} s)")
    print(f"ratio {loop_s / ours_s:.2f}x; max |score difference| {diff:.2e}")


if __name__ == "__main__":
    main()
