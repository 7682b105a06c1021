"""LoRA adapters: the base model and two adapters served by one process, requests under the
three sets side by side, against llama-server with the same adapters.

The adapters are the tests' tiny random ones (tests/fixtures/tiny_lora.py, seeds 1 and 2: rank
4 on four matrices of every third block, 0.73 MiB each for the default model), written next to
the results. edgeserve gets them as `--lora a=PATH --lora b=PATH`, llama-server as `--lora PATH
--lora PATH --lora-init-without-apply`; both run `--parallel 6` (PARALLEL) and get the same
request bodies, which choose the set with llama-server's `lora` field: adapter a is
`[{"id": 0, "scale": 1}]`, b `[{"id": 1, "scale": 1}]`, and the base sends every scale 0.
The base cannot go without the field: llama-server runs a request without one under its
start-up list, in which `--lora` gives every adapter scale 1 (`--lora-init-without-apply` only
leaves the context without them until the first request); edgeserve reads scale 0 as the base.

Each server takes two loads of 6 closed-loop streams of `--lora-requests` requests each
(greedy, end-of-generation banned, the bench's max_tokens and prompt size, prompts new in
every run): *mixed*, 2 streams under each
set (base, a, b), and *base-only*, all 6 on the base. The servers take turns in an order that
rotates each round, each running both loads back to back (which one first alternates), so a
round's pair is measured close in time. llama.cpp decodes one adapter set per batch, so a
mixed step carries at most a third of the streams: the figures are the aggregate tokens/s of
each load, mixed / base-only (per round, then the median), the inter-token latency (ITL)
p50/p99 of each, and per set in the mixed load its tokens/s, time to first token and longest
gap (whether every set gets its turns, and when). Before the runs each server answers one
short prompt under each set: the adapters must change the answers, and both servers should
give the same ones (up to near-ties).

Memory (edgeserve only): one edgeserve with base + a + b, alone, against three at once with
base, base + a and base + b (what serving the three sets took before adapters: a process
each), each measured after a short request under every set it serves, all `--parallel 6`.
Reported: RSS (which counts the mmap-ed model file in every process), PSS (which shares those
pages out among the processes mapping them, so the three's sum holds them once: the memory the
machine gives) and anonymous memory, of the one against the three's sum.

A server whose `--help` has no `--lora` (an edgeserve from before adapters) is not started and
shows "n/a", as does one that does not start with the adapters or fails the warm-up.
"""

from __future__ import annotations

import asyncio
import re
import statistics
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TypeVar

import aiohttp

from bench import load
from bench.anchors import EDGESERVE, EDGESERVES, LLAMA_SERVER, Setup
from bench.images import lacks_flag
from bench.turns import rotated

T = TypeVar("T")
PARALLEL = 6
# The sets a request runs under: the base model and the two adapters (ids 0 and 1).
BASE = "base"
ADAPTERS = ("a", "b")
SETS = (BASE, *ADAPTERS)
SEEDS = {"a": 1, "b": 2}
MIXED, BASE_ONLY = "mixed", "base-only"
MODES = (MIXED, BASE_ONLY)
# The servers this workload runs (in the bench's order).
KINDS = (*EDGESERVES, LLAMA_SERVER)
# The memory case's processes: the sets each one serves.
ONE_PROCESS = "base + a + b"
THREE_PROCESSES = {"base": (BASE,), "base + a": (BASE, "a"), "base + b": (BASE, "b")}
# A prompt whose greedy answer (end-of-generation allowed) each tiny adapter changes from the
# first token, and which both servers answered alike under each set when it was chosen (others
# met a near-tie within 16 tokens: the default model's base answers echo the prompt, then drift).
WARM_UP_PROMPT = "Name three animals."
WARM_UP_TOKENS = 16
# The figures of each run kept per mode: the run's field and the summary key's suffix.
RUN_FIGURES = {
    "aggregate_tps": "tps",
    "stream_tps_p50": "stream_tps_p50",
    "ttft_p50_ms": "ttft_p50_ms",
    "itl_p50_ms": "itl_p50_ms",
    "itl_p99_ms": "itl_p99_ms",
    "itl_max_ms": "itl_max_ms",
}
PREFIX = {MIXED: "mixed", BASE_ONLY: "base"}


def adapter_path(out: Path, name: str) -> Path:
    """Where adapter `name` is written."""
    return out / f"tiny-lora-{name}.gguf"


def write_adapters(out: Path, model: Path) -> list[Path]:
    """The tests' tiny adapters a and b for `model` (seeds 1 and 2), written into `out`."""
    from tests.fixtures.tiny_lora import write_lora  # needs numpy and the gguf package

    out.mkdir(parents=True, exist_ok=True)
    return [write_lora(adapter_path(out, name), model, seed=SEEDS[name]) for name in ADAPTERS]


def offers_lora(help_text: str) -> bool:
    """Whether a server's `--help` lists the `--lora` flag itself (not only longer flags such
    as --lora-scaled or edgeserve's --allow-runtime-lora)."""
    return re.search(r"(?<![\w-])--lora(?![\w-])", help_text) is not None


def missing_lora(kind: str, setup: Setup) -> str | None:
    """Why `kind` cannot serve adapters; None when its `--help` has `--lora`."""
    return lacks_flag(kind, setup, offers_lora, "no --lora (a version without adapters)")


def server_args(kind: str, paths: Sequence[Path]) -> tuple[str, ...]:
    """The arguments that load the adapters (ids 0, 1, ... in `paths` order) without applying
    them to requests that do not ask."""
    if kind in EDGESERVES:
        return tuple(
            arg
            for name, path in zip(ADAPTERS, paths, strict=True)
            for arg in ("--lora", f"{name}={path}")
        )
    if kind == LLAMA_SERVER:
        return (
            *(arg for path in paths for arg in ("--lora", str(path))),
            "--lora-init-without-apply",
        )
    raise ValueError(f"{kind} does not take adapters here")


def turns(servers: Sequence[T], rnd: int) -> list[tuple[T, str]]:
    """Round `rnd`'s runs: the servers in an order that rotates each round, each taking both
    loads back to back (so that a round's mixed / base-only pairs runs close in time), which of
    the two goes first alternating each round."""
    if not servers:
        return []
    modes = MODES if rnd % 2 == 0 else MODES[::-1]
    return [(server, mode) for server in rotated(servers, rnd) for mode in modes]


def lora_field(set_name: str) -> list[dict[str, Any]]:
    """llama-server's `lora` field for a set: the adapter at scale 1, or every scale 0 for the
    base."""
    if set_name == BASE:
        return [{"id": i, "scale": 0.0} for i in range(len(ADAPTERS))]
    return [{"id": ADAPTERS.index(set_name), "scale": 1.0}]


def stream_set(mode: str, worker: int) -> str:
    """The set stream `worker` runs under: in turn base, a, b in the mixed load, else base."""
    return SETS[worker % len(SETS)] if mode == MIXED else BASE


def prompt_index(rnd: int, mode: str, request: int, worker: int, attempt: int = 0) -> int:
    """The prompt of one request: new for every round, load, request, stream and attempt
    (as `load_prompt_index`), apart from the other workloads' prompts, the same for every
    server."""
    index = 10_000_000 + 100_000 * rnd + 10_000 * MODES.index(mode) + 100 * request + worker
    return index + load.ATTEMPT_STRIDE * attempt


def body(
    kind: str, set_name: str, prompt: str, max_tokens: int, eog_ids: Sequence[int]
) -> dict[str, Any]:
    """The bench's greedy streamed chat request under `set_name` (the model's `eog_ids`
    banned)."""
    messages = [{"role": "user", "content": prompt}]
    return load.chat_body(kind, messages, max_tokens, eog_ids) | {"lora": lora_field(set_name)}


def set_figures(streams: list[load.Stream], wall: float) -> dict[str, Any]:
    """One set's share of a run: its tokens/s over the run's wall time, its streams' median
    decode speed, median time to the first token and longest gap."""
    tokens = sum(s.tokens for s in streams)
    rates = [s.decode_tps for s in streams if s.decode_tps is not None]
    gaps = [g for s in streams for g in s.gaps]
    return {
        "streams": len(streams),
        "tokens": tokens,
        "tps": tokens / wall if wall > 0 else 0.0,
        "stream_tps_p50": statistics.median(rates) if rates else None,
        "ttft_p50_ms": _median([None if s.ttft is None else s.ttft * 1000.0 for s in streams]),
        "itl_max_ms": max(gaps) * 1000.0 if gaps else None,
    }


async def run(
    url: str,
    kind: str,
    mode: str,
    rnd: int,
    per_stream: int,
    max_tokens: int,
    prompt_words: int,
    eog_ids: Sequence[int],
    streams: int = PARALLEL,
    attempt: int = 0,
) -> dict[str, Any]:
    """One load: `streams` workers each stream `per_stream` requests back to back under their
    set (`stream_set`); the run's figures (load.RunResult's) and each set's."""
    done: list[tuple[str, load.Stream]] = []

    async def worker(w: int, http: aiohttp.ClientSession) -> None:
        set_name = stream_set(mode, w)
        for r in range(per_stream):
            prompt = load.prompt_text(prompt_index(rnd, mode, r, w, attempt), prompt_words)
            done.append(
                (
                    set_name,
                    await load.stream_chat(
                        http, url, body(kind, set_name, prompt, max_tokens, eog_ids)
                    ),
                )
            )

    async with load.session(streams + 2) as http:
        started = time.perf_counter()
        await asyncio.gather(*(worker(w, http) for w in range(streams)))
        wall = time.perf_counter() - started
    result = load.summarize(kind, streams, [s for _, s in done], wall).to_json()
    by_set = {
        name: set_figures([s for n, s in done if n == name], wall)
        for name in SETS
        if any(n == name for n, _ in done)
    }
    return result | {"mode": mode, "round": rnd, "per_set": by_set}


async def warm_up(url: str, kind: str) -> dict[str, Any]:
    """The same short prompt under each set, one after the other: each set's answer and the
    first error."""
    texts: dict[str, str] = {}
    error = None
    async with load.session() as http:
        for set_name in SETS:
            req = body(kind, set_name, WARM_UP_PROMPT, WARM_UP_TOKENS, ())
            del req["logit_bias"]  # the answer may end: past its end, tokens are near-ties
            stream = await load.stream_chat(http, url, req)
            texts[set_name] = stream.text
            if stream.error:
                error = error or f"{set_name}: {stream.error}"
    return {"texts": texts, "error": error}


async def named_requests(url: str, sets: Sequence[str], eog_ids: Sequence[int]) -> str | None:
    """A short request under each of `sets`, chosen by name ("model": the adapter's name, any
    other name for the base): the memory case's warm-up; the first error."""
    async with load.session() as http:
        for set_name in sets:
            messages = [{"role": "user", "content": WARM_UP_PROMPT}]
            req = load.chat_body(EDGESERVE, messages, WARM_UP_TOKENS, eog_ids)
            req["model"] = "bench" if set_name == BASE else set_name
            stream = await load.stream_chat(http, url, req)
            if stream.error:
                return f"{set_name}: {stream.error}"
    return None


def process_memory(pid: int) -> dict[str, int | None]:
    """RSS, anonymous RSS and PSS (bytes) of a live process (None where unreadable)."""
    out: dict[str, int | None] = {"rss": None, "rss_anon": None, "pss": None}
    fields = {"VmRSS": "rss", "RssAnon": "rss_anon"}
    for path, wanted in (
        (f"/proc/{pid}/status", fields),
        (f"/proc/{pid}/smaps_rollup", {"Pss": "pss"}),
    ):
        try:
            with open(path) as fh:
                for line in fh:
                    key, _, rest = line.partition(":")
                    if key in wanted:
                        out[wanted[key]] = int(rest.split()[0]) * 1024
        except OSError:
            pass
    return out


def memory_figures(
    one: dict[str, int | None], three: dict[str, dict[str, int | None]]
) -> dict[str, Any]:
    """The one process against the three: each one's figures, the three's sums and one / three
    (None where a figure is missing)."""
    total: dict[str, int | None] = {}
    for key in ("rss", "rss_anon", "pss"):
        values = [m.get(key) for m in three.values()]
        total[key] = None if any(v is None for v in values) else sum(v or 0 for v in values)
    ratios = {
        key: (one[key] / total[key]) if one.get(key) is not None and total[key] else None
        for key in ("rss", "rss_anon", "pss")
    }
    return {"one": one, "three": three, "three_total": total, "one_over_three": ratios}


def _median(values: Sequence[float | None]) -> float | None:
    present = [float(v) for v in values if v is not None]
    return float(statistics.median(present)) if present else None


def summarize(runs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    """One server's figures over its rounds: per load the medians of RUN_FIGURES (and each
    round's value, `<key>_rounds`), mixed / base-only per round and its median, the streams cut
    short, each set's median tokens/s and first-token time and its longest gap in the mixed load,
    the first errors."""
    mine = [r for r in runs if r["server"] == kind]
    out: dict[str, Any] = {}
    for mode in MODES:
        of_mode = sorted((r for r in mine if r["mode"] == mode), key=lambda r: r["round"])
        for field, suffix in RUN_FIGURES.items():
            key = f"{PREFIX[mode]}_{suffix}"
            values = [r.get(field) for r in of_mode]
            out[key] = _median(values)
            out[f"{key}_rounds"] = [v for v in values if v is not None]
    mixed = {r["round"]: r["aggregate_tps"] for r in mine if r["mode"] == MIXED}
    base = {r["round"]: r["aggregate_tps"] for r in mine if r["mode"] == BASE_ONLY}
    ratios = [mixed[rnd] / base[rnd] for rnd in sorted(mixed) if base.get(rnd)]
    out["mixed_over_base_rounds"] = ratios
    out["mixed_over_base"] = _median(ratios)
    out["short"] = sum(r.get("short", 0) for r in mine) if mine else None
    per_set: dict[str, dict[str, float | None]] = {}
    for name in SETS:
        sets = [(r.get("per_set") or {}).get(name) for r in mine if r["mode"] == MIXED]
        present = [s for s in sets if s]
        if present:
            gaps = [s.get("itl_max_ms") for s in present if s.get("itl_max_ms") is not None]
            per_set[name] = {
                "tps": _median([s.get("tps") for s in present]),
                "ttft_p50_ms": _median([s.get("ttft_p50_ms") for s in present]),
                "itl_max_ms": max(gaps) if gaps else None,
            }
    out["mixed_per_set"] = per_set
    out["errors"] = [e for r in mine for e in r.get("errors") or []][:5]
    return out


def answers_check(warm: dict[str, dict[str, str]]) -> dict[str, Any]:
    """From each server's warm-up answers: per server how many adapters changed the base's
    answer, and how many sets every server answered alike."""
    changed = {
        kind: sum(texts.get(name) != texts.get(BASE) for name in ADAPTERS)
        for kind, texts in warm.items()
    }
    kinds = list(warm)
    alike = (
        sum(len({warm[kind].get(name) for kind in kinds}) == 1 for name in SETS)
        if len(kinds) > 1
        else None
    )
    return {"adapters_changed": changed, "sets_alike": alike, "sets": len(SETS)}
