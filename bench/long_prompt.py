"""The long-prompt workload: time to first token on prompts of a few thousand tokens that no
server has seen.

Each server runs alone in its sequence (`--parallel 1`) with a context of CTX cells. Every
round sends new random text of each size (the same text to every server in that round, the
servers taking turns, the order rotating), asking for GEN_TOKENS tokens; the prompt sizes in
words come from the tokens per word the first server counted on a calibration prompt.
Reported per size and server: the median TTFT over the rounds and the prompt tokens.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any

from bench import load

PARALLEL = 1
CTX = 8192
GEN_TOKENS = 4
CALIBRATION_WORDS = 1000
# Prompt indices of this workload: apart from every other workload's.
INDEX_BASE = 30_000_000


def parse_sizes(text: str) -> list[int]:
    """Prompt sizes in tokens from "2000,6000"; each must leave room for the answer in CTX."""
    sizes = [int(v) for v in text.split(",") if v.strip()]
    if not sizes or any(not 0 < s <= CTX - 64 for s in sizes):
        raise ValueError(f"long-prompt sizes must be between 1 and {CTX - 64} tokens: {text!r}")
    return sizes


def words_for(tokens: int, tokens_per_word: float) -> int:
    """How many words of bench text make about `tokens` prompt tokens."""
    return max(1, round(tokens / tokens_per_word))


def prompt_index(rnd: int, which: int) -> int:
    """The prompt of round `rnd` and the `which`-th size: new for every round and size."""
    return INDEX_BASE + 100 * rnd + which


async def calibrate(url: str, kind: str, eog_ids: Sequence[int]) -> float:
    """Prompt tokens per word of bench text, from one request's usage (which also warms up the
    server on a long batch)."""
    stream = await load.warm_up(url, kind, CALIBRATION_WORDS, eog_ids)
    if stream.error or not stream.prompt_tokens:
        raise RuntimeError(f"{kind} long-prompt calibration failed: {stream.error or 'no usage'}")
    return stream.prompt_tokens / CALIBRATION_WORDS


async def first_token(
    url: str, kind: str, index: int, words: int, eog_ids: Sequence[int]
) -> load.Stream:
    """The long prompt `index` of `words` words, streamed: its TTFT and prompt tokens."""
    text = load.prompt_text(index, words)
    body = load.chat_body(kind, [{"role": "user", "content": text}], GEN_TOKENS, eog_ids)
    async with load.session() as http:
        return await load.stream_chat(http, url, body)


def summarize(streams: dict[int, list[load.Stream]]) -> dict[str, Any]:
    """One server's figures per size (keys: the size as a string): the TTFT of each round (ms),
    their median, the median prompt tokens, streams cut short and the first errors."""
    out: dict[str, Any] = {}
    for size, done in streams.items():
        ttfts = [s.ttft * 1000.0 for s in done if s.ttft is not None]
        prompts = [s.prompt_tokens for s in done if s.prompt_tokens is not None]
        out[str(size)] = {
            "ttft_ms": ttfts,
            "ttft_p50_ms": statistics.median(ttfts) if ttfts else None,
            "prompt_tokens": statistics.median(prompts) if prompts else None,
            "short": sum(s.short for s in done),
            "errors": [s.error for s in done if s.error][:3],
        }
    return out
