"""Single-stream decode speed of a running edgeserve, next to llama-bench's tg figure.

    python -m bench.single_stream --url http://127.0.0.1:8000 [--llama-bench PATH --model GGUF]

Streams one chat completion with EOS banned so exactly --tokens tokens are generated, and
reports tokens/s between the first and the last content chunk (decode speed, no prefill).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import time

import aiohttp

EOS_BAN = {"1": -100, "106": -100, "212": -100}


async def one_stream(session: aiohttp.ClientSession, url: str, tokens: int) -> float:
    """Decode tokens/s of one streamed request."""
    body = {
        "model": "bench",
        "messages": [{"role": "user", "content": "Write a long story about the sea."}],
        "max_tokens": tokens,
        "temperature": 0,
        "logit_bias": EOS_BAN,
        "stream": True,
    }
    stamps: list[float] = []
    async with session.post(f"{url}/v1/chat/completions", json=body) as resp:
        resp.raise_for_status()
        async for line in resp.content:
            if line.startswith(b"data: {") and b'"content": "' in line:
                stamps.append(time.perf_counter())
    return (len(stamps) - 1) / (stamps[-1] - stamps[0])


def llama_bench_tg(binary: str, model: str, threads: int, tokens: int) -> float:
    """llama-bench's tg<tokens> average tokens/s."""
    out = subprocess.run(
        [binary, "-m", model, "-t", str(threads), "-p", "0", "-n", str(tokens), "-o", "json"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return float(json.loads(out)[0]["avg_ts"])


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--url", default="http://127.0.0.1:8000")
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--llama-bench")
    parser.add_argument("--model")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    async with aiohttp.ClientSession() as session:
        await one_stream(session, args.url, 8)
        rates = [await one_stream(session, args.url, args.tokens) for _ in range(args.runs)]
    ours = statistics.median(rates)
    print(f"edgeserve single stream: {ours:.1f} tok/s (median of {args.runs}: {rates})")
    if args.llama_bench and args.model:
        tg = llama_bench_tg(args.llama_bench, args.model, args.threads, args.tokens)
        print(
            f"llama-bench tg{args.tokens}: {tg:.1f} tok/s; edgeserve/llama-bench = {ours / tg:.3f}"
        )


if __name__ == "__main__":
    asyncio.run(main())
