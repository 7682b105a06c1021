"""Several models behind one server: edgeserve's catalogue against llama-server's router, on
the same two GGUF files (the default model and the second one), threads and context.

The two files are linked into one folder, each under a short id (`model_ids`: gemma,
smollm2), which edgeserve serves with `--models-dir DIR --keep-alive=-1` (one process, an
engine per model, loaded on demand) and llama-server with `--models-dir DIR` (its router: a
child llama-server per model, spawned on demand; a model whose GGUF has no chat template gets
the bench's built-in one in a `--models-preset` file, as `--chat-template` does for a single
model). Both run `--parallel 1` (PARALLEL) per model and nothing unloads by itself. Every
request is the bench's greedy streamed chat request with the model's end-of-generation tokens
banned, its `model` field naming the id.

After a warm-up request to each model (both loaded), per server:

- *alternating*: in each of `--rounds` rounds (the servers taking turns, the order rotating),
  two closed-loop streams, one per model, each `--requests` requests of `--tokens` tokens on
  `--prompt-words` prompts, new in every run: the aggregate tokens/s over the run's wall time,
  each model's share, the inter-token p99;
- *RSS with both loaded*, after those runs: the server's process and every process below it
  (llama-server's router and its children) together;
- *cold switch*: in each round, for each model in turn (which first alternates): every model
  unloaded (POST /models/unload, then GET /models until none is loaded and no child process is
  left), then one streamed request for that model with a short prompt (SWITCH_WORDS words) and
  SWITCH_TOKENS tokens: its time to the first token, which holds the load;
- *one-model budget* (the edgeserves only): a fresh server with a `--models-memory` that fits
  the larger model but not both (`one_model_budget`, from the estimates edgeserve's GET /models
  shows), then `--models-budget-requests` requests one at a time, the models alternating (each
  one unloads the other to load): the errors and the peak RSS (VmHWM) against the budget
  + 10%.

A server whose `--help` has no `--models-dir` (an edgeserve from before the catalogue) is not
started and shows "n/a", as does one that does not start or fails the warm-up.
"""

from __future__ import annotations

import asyncio
import re
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import aiohttp

from bench import load, lora
from bench.anchors import EDGESERVES, LLAMA_SERVER, Server, Setup, process_tree
from bench.images import lacks_flag
from bench.turns import rotated

# The servers this workload runs (in the bench's order).
KINDS = (*EDGESERVES, LLAMA_SERVER)
PARALLEL = 1
# The cold switch's and the budget case's requests: a short prompt, a few tokens.
SWITCH_WORDS = 16
SWITCH_TOKENS = 8
# Peak RSS allowed in the one-model budget case: the budget plus 10%.
BUDGET_SLACK = 1.1
# Statuses of a model that holds no memory.
UNLOADED = ("unloaded", "failed")
UNLOAD_TIMEOUT_S = 60.0
POLL_S = 0.05
# Prompt indices, apart from the other workloads' (lora: 10M, long prompts: 30M).
ALTERNATING_INDEX = 40_000_000
COLD_INDEX = 41_000_000
BUDGET_INDEX = 42_000_000
PRESET_NAME = "models-preset.ini"


def model_ids(paths: Sequence[Path]) -> dict[str, Path]:
    """A catalogue id per model file: the first word of its name, lower-case
    (gemma-3-270m-q4_k_m.gguf: gemma; SmolLM2-135M-Instruct.Q4_1.gguf: smollm2), with the
    file's place in `paths` added where two would share one."""
    ids: dict[str, Path] = {}
    for place, path in enumerate(paths, 1):
        word = re.split(r"[-._ ]", path.name.lower(), maxsplit=1)[0] or "model"
        ids[word if word not in ids else f"{word}-{place}"] = path
    return ids


def write_models_dir(folder: Path, models: Mapping[str, Path]) -> Path:
    """`folder` holding a link ID.gguf to each model's file, and nothing else."""
    folder.mkdir(parents=True, exist_ok=True)
    for stale in folder.glob("*.gguf"):
        stale.unlink()
    for model_id, path in models.items():
        (folder / f"{model_id}.gguf").symlink_to(path.resolve())
    return folder


def preset_ini(templates: Mapping[str, str | None]) -> str:
    """llama-server's --models-preset file: a section for each model whose GGUF has no chat
    template (`templates`: id -> the bench's built-in template, None for the GGUF's own),
    setting that template as `--no-jinja --chat-template NAME` sets it for one model."""
    lines = ["version = 1"]
    for model_id, name in templates.items():
        if name:
            lines += ["", f"[{model_id}]", "jinja = false", f"chat-template = {name}"]
    return "\n".join(lines) + "\n"


def offers_models_dir(help_text: str) -> bool:
    """Whether a server's `--help` lists the `--models-dir` flag."""
    return re.search(r"--models-dir(?![\w-])", help_text) is not None


def missing_catalogue(kind: str, setup: Setup) -> str | None:
    """Why `kind` cannot serve a folder of models; None when its `--help` has
    `--models-dir`."""
    reason = "no --models-dir (a version without several models)"
    return lacks_flag(kind, setup, offers_models_dir, reason)


def server_args(
    kind: str, preset: Path | None = None, budget: int | None = None
) -> tuple[str, ...]:
    """The arguments beside `--models-dir`: for an edgeserve, models that never unload when
    idle and, with `budget`, the models' memory budget in bytes; for llama-server, the preset
    file (None: none)."""
    if kind in EDGESERVES:
        return ("--keep-alive=-1", *(("--models-memory", str(budget)) if budget else ()))
    if kind == LLAMA_SERVER:
        return ("--models-preset", str(preset)) if preset else ()
    raise ValueError(f"{kind} serves one model")


def one_model_budget(estimated: Mapping[str, int]) -> int:
    """A models' memory budget that fits the largest model alone but not beside the smallest:
    the largest estimate plus half the smallest."""
    return max(estimated.values()) + min(estimated.values()) // 2


def statuses(listing: Mapping[str, Any]) -> dict[str, str]:
    """Model id -> `status.value` of a GET /models answer (llama-server's router shape)."""
    return {
        card["id"]: str((card.get("status") or {}).get("value"))
        for card in listing.get("data") or ()
    }


def estimates(listing: Mapping[str, Any]) -> dict[str, int]:
    """Model id -> `memory.estimated` (bytes) of edgeserve's GET /models, for the models that
    have one."""
    found = {card["id"]: (card.get("memory") or {}).get("estimated") for card in listing["data"]}
    return {model_id: int(v) for model_id, v in found.items() if isinstance(v, int)}


def switch_order(ids: Sequence[str], rnd: int) -> list[str]:
    """The models of round `rnd`'s cold switches: each once, which first alternating."""
    return rotated(ids, rnd)


def alternating_index(rnd: int, request: int, worker: int, attempt: int = 0) -> int:
    """The prompt of one request of the alternating runs: new for every round, request,
    stream and attempt, the same for every server."""
    return (
        ALTERNATING_INDEX + 100_000 * rnd + 100 * request + worker + load.ATTEMPT_STRIDE * attempt
    )


def cold_index(rnd: int, which: int) -> int:
    """The prompt of round `rnd`'s `which`-th cold switch, the same for every server."""
    return COLD_INDEX + 100 * rnd + which


def body(
    kind: str, model_id: str, eog_ids: Sequence[int], prompt: str, max_tokens: int
) -> dict[str, Any]:
    """The bench's greedy streamed chat request for the model `model_id` (its `eog_ids`
    banned)."""
    messages = [{"role": "user", "content": prompt}]
    return load.chat_body(kind, messages, max_tokens, eog_ids) | {"model": model_id}


async def listing(http: aiohttp.ClientSession, url: str) -> dict[str, Any]:
    """GET /models."""
    async with http.get(f"{url}/models") as resp:
        if resp.status != 200:
            raise RuntimeError(f"GET /models: HTTP {resp.status}: {(await resp.text())[:200]}")
        found: dict[str, Any] = await resp.json()
        return found


async def unload_all(server: Server, timeout: float = UNLOAD_TIMEOUT_S) -> None:
    """Unload every model of `server`, then wait until GET /models lists none loaded or
    loading and no process is left below the server's (llama-server's children have
    exited)."""
    async with load.session() as http:
        for model_id, status in statuses(await listing(http, server.url)).items():
            if status not in UNLOADED:
                unload = f"{server.url}/models/unload"
                async with http.post(unload, json={"model": model_id}) as resp:
                    if resp.status != 200:
                        text = (await resp.text())[:200]
                        raise RuntimeError(
                            f"{server.kind}: unload {model_id}: HTTP {resp.status}: {text}"
                        )
        deadline = time.monotonic() + timeout
        while True:
            now = statuses(await listing(http, server.url))
            if all(s in UNLOADED for s in now.values()) and len(process_tree(server.proc.pid)) == 1:
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"{server.kind}: models {now} {timeout:.0f} s after unloading")
            await asyncio.sleep(POLL_S)


async def warm_up(url: str, kind: str, models: Mapping[str, Sequence[int]]) -> str | None:
    """A short request to each model (`models`: id -> its EOG ids), which loads it; the first
    error."""
    async with load.session() as http:
        for model_id, eog_ids in models.items():
            req = body(kind, model_id, eog_ids, load.prompt_text(0, SWITCH_WORDS), SWITCH_TOKENS)
            stream = await load.stream_chat(http, url, req)
            if stream.error or stream.ttft is None:
                return f"{model_id}: {stream.error or 'no content streamed'}"
    return None


async def first_token(
    url: str, kind: str, model_id: str, eog_ids: Sequence[int], index: int
) -> load.Stream:
    """One short streamed request for `model_id` (prompt `index`)."""
    req = body(kind, model_id, eog_ids, load.prompt_text(index, SWITCH_WORDS), SWITCH_TOKENS)
    async with load.session() as http:
        return await load.stream_chat(http, url, req)


async def alternating(
    url: str,
    kind: str,
    models: Mapping[str, Sequence[int]],
    rnd: int,
    per_stream: int,
    max_tokens: int,
    prompt_words: int,
    attempt: int = 0,
) -> dict[str, Any]:
    """One alternating run: a closed-loop stream per model (`models`: id -> its EOG ids), each
    `per_stream` requests back to back; the run's figures (load.RunResult's) and each model's
    share (lora.set_figures)."""
    done: list[tuple[str, load.Stream]] = []

    async def worker(w: int, model_id: str, http: aiohttp.ClientSession) -> None:
        for r in range(per_stream):
            prompt = load.prompt_text(alternating_index(rnd, r, w, attempt), prompt_words)
            req = body(kind, model_id, models[model_id], prompt, max_tokens)
            done.append((model_id, await load.stream_chat(http, url, req)))

    async with load.session(len(models) + 2) as http:
        started = time.perf_counter()
        await asyncio.gather(*(worker(w, m, http) for w, m in enumerate(models)))
        wall = time.perf_counter() - started
    result = load.summarize(kind, len(models), [s for _, s in done], wall).to_json()
    per_model = {m: lora.set_figures([s for n, s in done if n == m], wall) for m in models}
    return result | {"round": rnd, "per_model": per_model}


async def one_at_a_time(
    url: str,
    kind: str,
    models: Mapping[str, Sequence[int]],
    requests: int,
    rss: Callable[[], int],
) -> list[tuple[str, load.Stream, int]]:
    """`requests` short requests one after the other, the models taking turns (the budget
    case); (model id, stream, the server's RSS after its answer: `rss()`) each."""
    ids = list(models)
    done = []
    async with load.session() as http:
        for i in range(requests):
            model_id = ids[i % len(ids)]
            prompt = load.prompt_text(BUDGET_INDEX + i, SWITCH_WORDS)
            req = body(kind, model_id, models[model_id], prompt, SWITCH_TOKENS)
            done.append((model_id, await load.stream_chat(http, url, req), rss()))
    return done


def cold_record(server: str, rnd: int, model_id: str, stream: load.Stream) -> dict[str, Any]:
    """One cold switch as the results keep it."""
    return {
        "server": server,
        "round": rnd,
        "model": model_id,
        "ttft_ms": None if stream.ttft is None else stream.ttft * 1000.0,
        "tokens": stream.tokens,
        "short": stream.short,
        "error": stream.error,
    }


def _median(values: Sequence[float | None]) -> float | None:
    present = [float(v) for v in values if v is not None]
    return float(statistics.median(present)) if present else None


def summarize(runs: list[dict[str, Any]], cold: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    """One server's figures: the alternating runs' median aggregate tokens/s and inter-token
    p99 (with each round's value, `<key>_rounds`) and each model's median stream speed (its
    tokens/s after the first token); the cold switches' median TTFT over all of them (each
    one's value in `cold_ttft_ms_rounds`) and per model; the streams cut short and the first
    errors of both."""
    mine = sorted((r for r in runs if r["server"] == kind), key=lambda r: r["round"])
    switches = [c for c in cold if c["server"] == kind]
    out: dict[str, Any] = {}
    for key, field in (
        ("alternating_tps", "aggregate_tps"),
        ("alternating_itl_p99_ms", "itl_p99_ms"),
    ):
        values = [r.get(field) for r in mine]
        out[key] = _median(values)
        out[f"{key}_rounds"] = [v for v in values if v is not None]
    models = sorted({m for r in mine for m in r.get("per_model") or {}})
    out["alternating_stream_tps_by_model"] = {
        m: _median([(r.get("per_model") or {}).get(m, {}).get("stream_tps_p50") for r in mine])
        for m in models
    }
    ttfts = [c["ttft_ms"] for c in switches]
    out["cold_ttft_p50_ms"] = _median(ttfts)
    out["cold_ttft_ms_rounds"] = [v for v in ttfts if v is not None]
    out["cold_ttft_p50_ms_by_model"] = {
        m: _median([c["ttft_ms"] for c in switches if c["model"] == m])
        for m in sorted({c["model"] for c in switches})
    }
    out["short"] = (
        sum(int(r.get("short") or 0) for r in mine) + sum(bool(c["short"]) for c in switches)
        if mine or switches
        else None
    )
    errors = [e for r in mine for e in r.get("errors") or []]
    out["errors"] = (errors + [f"{c['model']}: {c['error']}" for c in switches if c["error"]])[:5]
    return out


def budget_figures(
    done: list[tuple[str, load.Stream, int]],
    budget: int,
    estimated: Mapping[str, int],
    rss_start: int | None,
    rss_peak: int | None,
) -> dict[str, Any]:
    """The one-model budget case: its requests, those that failed or were cut short, the
    first errors, the median time to the first token (each one a switch), the RSS before the
    first request, after each answer (`rss_after`: whether it grows with the switches) and at
    its peak (VmHWM, between the answers too) against the budget + 10%."""
    streams = [s for _, s, _ in done]
    bound = int(budget * BUDGET_SLACK)
    return {
        "budget": budget,
        "bound": bound,
        "estimated": dict(estimated),
        "requests": len(streams),
        "errors": sum(s.short for s in streams),
        "error_samples": [f"{m}: {s.error}" for m, s, _ in done if s.error][:5],
        "ttft_p50_ms": _median([None if s.ttft is None else s.ttft * 1000.0 for s in streams]),
        "rss_start": rss_start,
        "rss_after": [rss for _, _, rss in done],
        "rss_peak": rss_peak,
        "within": None if rss_peak is None else rss_peak <= bound,
    }
