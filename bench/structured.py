"""Structured output: the cost of a grammar-constrained token, edgeserve against llama-server.

End to end: each server answers the same `json_schema` requests (a nested schema, temperature
1 over the full distribution, no seed, servers taking turns); reported are milliseconds per
completion token, answers that stopped, and invalid answers (must be 0): a stopped answer that
`json.loads` refuses, or a cut one with a raw control character inside a string.

Per token: what a token the grammar refuses costs is the native grammar pass that finds an
accepted one. Both servers first check only the sampled token; on a refusal llama-server
filters the whole vocabulary (common_sampler_sample), edgeserve first the 4096 likeliest
candidates (edgeserve/engine/llama/sampling.py). Timed here on the same grammar states with this
machine's llama.cpp: one token, 4096 candidates, the whole vocabulary.
"""

from __future__ import annotations

import ctypes
import json
import time
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np

from bench.anchors import LLAMA_SERVER
from bench.turns import rotated

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 24},
        "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 4},
        "where": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "floor": {"type": "integer"}},
            "required": ["city", "floor"],
        },
    },
    "required": ["name", "tags", "where"],
}
PROMPT = "Describe a small robot shop as JSON."
# Grammar states at which a refused token is timed: inside a string, after "{", after a value.
STATES = ('{"name": "Rob', "{", '{"name": "Rob", "tags": []')


def body(kind: str, max_tokens: int) -> dict[str, Any]:
    """The same request for both servers: the whole distribution at temperature 1."""
    request: dict[str, Any] = {
        "model": "bench",
        "messages": [{"role": "user", "content": PROMPT}],
        "response_format": {
            "type": "json_schema",
            "json_schema": {"name": "shop", "schema": SCHEMA},
        },
        "max_tokens": max_tokens,
        "temperature": 1.0,
        "top_p": 1.0,
    }
    if kind == LLAMA_SERVER:  # its own defaults would truncate to top-k 40, min-p 0.05
        request |= {"top_k": 0, "min_p": 0.0}
    return request


async def one(http: aiohttp.ClientSession, url: str, request: dict[str, Any]) -> dict[str, Any]:
    """One answer: seconds, completion tokens, finish reason, whether it is valid JSON."""
    started = time.perf_counter()
    async with http.post(f"{url}/v1/chat/completions", json=request) as resp:
        data = await resp.json()
        if resp.status != 200:
            raise RuntimeError(f"structured request failed: {resp.status} {data}")
    seconds = time.perf_counter() - started
    choice = data["choices"][0]
    text = choice["message"]["content"] or ""
    if choice["finish_reason"] == "stop":
        try:
            json.loads(text)
            valid = True
        except ValueError:
            valid = False
    else:
        valid = not raw_control_in_string(text)
    return {
        "seconds": seconds,
        "tokens": data["usage"]["completion_tokens"],
        "stopped": choice["finish_reason"] == "stop",
        "valid": valid,
    }


def raw_control_in_string(text: str) -> bool:
    """Whether a (possibly cut) JSON text has a raw control character inside a string, which
    no JSON parser reads (whitespace between tokens may hold newlines)."""
    in_string = escaped = False
    for char in text:
        if in_string and not escaped and ord(char) < 0x20:
            return True
        if escaped:
            escaped = False
        elif char == "\\" and in_string:
            escaped = True
        elif char == '"':
            in_string = not in_string
    return False


async def compare(servers: list[tuple[str, str]], requests: int, max_tokens: int) -> dict[str, Any]:
    """`requests` answers per server (kind, url), taking turns; per-server totals."""
    answers: dict[str, list[dict[str, Any]]] = {kind: [] for kind, _ in servers}
    # A connection each: llama-server closes idle keep-alive connections after 5 s, and an
    # answer of each other server can take that long (a reused one fails as "disconnected").
    connector = aiohttp.TCPConnector(force_close=True)
    timeout = aiohttp.ClientTimeout(total=600)
    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as http:
        for kind, url in servers:
            await one(http, url, body(kind, 4))
        for index in range(requests):
            for kind, url in rotated(servers, index):
                answers[kind].append(await one(http, url, body(kind, max_tokens)))
    out = {}
    for kind, done in answers.items():
        tokens = sum(a["tokens"] for a in done)
        out[kind] = {
            "answers": len(done),
            "tokens": tokens,
            "ms_per_token": 1000 * sum(a["seconds"] for a in done) / max(tokens, 1),
            "stopped": sum(a["stopped"] for a in done),
            "invalid": sum(not a["valid"] for a in done),
        }
    return out


def refused_token_costs(model: Path, repeats: int = 5) -> dict[str, Any]:
    """Milliseconds of the native grammar passes a refused token needs, per grammar state."""
    import llama_cpp as lc
    from llama_cpp.llama_grammar import json_schema_to_gbnf

    params = lc.llama_model_default_params()
    params.vocab_only = True
    model_ptr = lc.llama_model_load_from_file(str(model).encode(), params)
    vocab = lc.llama_model_get_vocab(model_ptr)
    n_vocab = lc.llama_vocab_n_tokens(vocab)
    gbnf = json_schema_to_gbnf(json.dumps(SCHEMA)).encode()
    data = np.zeros(n_vocab, dtype=[("id", np.int32), ("logit", np.float32), ("p", np.float32)])
    pointer = data.ctypes.data_as(ctypes.POINTER(lc.llama_token_data))
    costs: dict[str, Any] = {}
    try:
        for state in STATES:
            grammar = lc.llama_sampler_init_grammar(vocab, gbnf, b"root")
            for token in tokenize(lc, vocab, state):
                lc.llama_sampler_accept(grammar, token)
            timings = {}
            for name, size in (("one_token", 1), ("head_4096", 4096), ("vocabulary", n_vocab)):
                best = float("inf")
                for _ in range(repeats):
                    data["id"] = np.arange(n_vocab)
                    data["logit"] = 1.0
                    array = lc.llama_token_data_array(data=pointer, size=size, selected=-1)
                    started = time.perf_counter()
                    lc.llama_sampler_apply(grammar, ctypes.byref(array))
                    best = min(best, time.perf_counter() - started)
                timings[name] = 1000 * best
            lc.llama_sampler_free(grammar)
            costs[state] = timings
    finally:
        lc.llama_model_free(model_ptr)
    return costs


def tokenize(lc: Any, vocab: Any, text: str) -> list[int]:
    """The tokens of `text` (no BOS)."""
    raw = text.encode()
    buffer = (lc.llama_token * (len(raw) + 8))()
    count = lc.llama_tokenize(vocab, raw, len(raw), buffer, len(buffer), False, False)
    return list(buffer[:count])
