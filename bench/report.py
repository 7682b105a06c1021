"""The bench's outputs: a table with the edgeserve/anchor ratios and, with a baseline, the
edgeserve/previous ratios and the regressions (bench/previous.py) on stdout, the section 7
targets checked, a JSON file and a PNG chart in bench/results/.

The speed workloads (the load levels, llama-bench, the per-step overhead, the long prompts) are
rendered per model: the default model's figures sit at the top level of the results, the second
model's in results["model2"], in the same shape."""

from __future__ import annotations

import json
import statistics
from collections.abc import Collection
from pathlib import Path
from typing import Any, NamedTuple

from bench.anchors import (
    ALL_SERVERS,
    EDGESERVE,
    EDGESERVE_BASELINE,
    EDGESERVES,
    LCP_SERVER,
    LLAMA_SERVER,
)
from bench.documents import IDLE_RSS_FACTOR, RESTART_FACTOR
from bench.grounded import kind_of
from bench.previous import NOISE, Figure, Versus, ratio, rounds_noise
from bench.several_models import BUDGET_SLACK

MIB = 1024 * 1024
# "Flat" over the soak: what the allocator may keep of a burst, not a per-request leak.
SOAK_SLACK_MIB = 16
# More soak growth than the baseline's by up to this much is no regression.
SOAK_GROWTH_FLOOR_MIB = 8.0


class Row(NamedTuple):
    """A line of the table: label, field, value format, whether higher is better (None:
    neither), the scale from the field's unit, and for the regression rule the noise (None:
    the rounds' spread, or NOISE without rounds; 0 for counts) and the absolute floor."""

    label: str
    key: str
    spec: str
    higher_is_better: bool | None
    scale: float = 1.0
    noise: float | None = None
    floor: float = 0.0


# A median gap between tokens is shown but never flagged: kept drafts arrive together, so it
# falls to ~0 ms as a server drafts more, and rises back when it bursts less, whatever each
# stream's speed (per-stream tok/s) or its stalls (p99, max).
RUN_ROWS = (
    Row("aggregate tok/s", "aggregate_tps", "{:.1f}", True),
    Row("per-stream tok/s p50", "stream_tps_p50", "{:.1f}", True),
    Row("TTFT p50 ms", "ttft_p50_ms", "{:.0f}", False),
    Row("TTFT p95 ms", "ttft_p95_ms", "{:.0f}", False),
    Row("inter-token p50 ms", "itl_p50_ms", "{:.1f}", None),
    Row("inter-token p99 ms", "itl_p99_ms", "{:.1f}", False),
    Row("inter-token max ms", "itl_max_ms", "{:.0f}", False),
    Row("streams cut short", "short", "{:.0f}", False, noise=0.0),
)
# The same load at the sampled temperature (each server's other sampling defaults).
SAMPLED_ROWS = (
    Row("sampled aggregate tok/s", "sampled_aggregate_tps", "{:.1f}", True),
    Row("sampled per-stream tok/s p50", "sampled_stream_tps_p50", "{:.1f}", True),
    Row("sampled TTFT p50 ms", "sampled_ttft_p50_ms", "{:.0f}", False),
    Row("sampled inter-token p99 ms", "sampled_itl_p99_ms", "{:.1f}", False),
)
# edgeserve's engine thread outside llama_decode, a step, and its wait for the event loops to
# send the step's tokens (its /metrics over each run). The wait is shown, never flagged: on
# the CPU it replaces the stalls a loop working beside the decode caused inside it, which the
# speed rows judge.
ENGINE_ROWS = (
    Row("engine ms a step beyond decode", "engine_step_ms", "{:.2f}", False, floor=0.05),
    Row("sampled engine ms beyond decode", "sampled_engine_step_ms", "{:.2f}", False, floor=0.05),
    Row("loop wait ms a step", "loop_wait_ms", "{:.2f}", None),
    Row("sampled loop wait ms a step", "sampled_loop_wait_ms", "{:.2f}", None),
)
LOAD_ROWS = RUN_ROWS + SAMPLED_ROWS + ENGINE_ROWS
MEMORY_ROWS = (
    *(
        Row(label, key, "{:.0f}", False, 1.0 / MIB)
        for label, key in (
            ("RSS loaded MiB", "rss_loaded"),
            ("RSS peak MiB", "rss_peak"),
            ("RSS idle after load MiB", "rss_idle"),
            ("  of which anonymous MiB", "rss_idle_anon"),
            ("  of which file-backed MiB", "rss_idle_file"),
            ("RSS after multi-turn MiB", "rss_after_multi_turn"),
            ("RSS after scoring MiB", "rss_after_scoring"),
        )
    ),
    Row("idle CPU %", "idle_cpu_pct", "{:.0f}", False, floor=1.0),
)
MULTI_TURN_ROWS = (
    Row("turn 1 TTFT p50 ms", "ttft1_p50_ms", "{:.0f}", False),
    Row("turn 2 TTFT p50 ms", "ttft2_p50_ms", "{:.0f}", False),
    Row("turn 2 prompt tokens", "prompt2_tokens", "{:.0f}", None),
    Row("turn 2 cached tokens", "cached2_tokens", "{:.0f}", True),
    Row("streams cut short", "short", "{:.0f}", False, noise=0.0),
)
# The images workload (bench/images.py), each server's figures over its new images.
IMAGE_ROWS = (
    Row("cold TTFT p50 ms", "ttft_p50_ms", "{:.0f}", False),
    Row("repeated-image TTFT p50 ms", "repeat_ttft_p50_ms", "{:.0f}", False),
    Row("generated tok/s p50", "decode_tps_p50", "{:.1f}", True),
    Row("prompt tokens", "prompt_tokens", "{:.0f}", None),
    Row("repeat cached tokens", "repeat_cached_tokens", "{:.0f}", True),
    Row("streams cut short", "short", "{:.0f}", False, noise=0.0),
)
# The per-image values behind a row's median (the rounds its "vs previous" noise comes from).
IMAGE_ROUNDS = {
    "ttft_p50_ms": "ttft_ms",
    "repeat_ttft_p50_ms": "repeat_ttft_ms",
    "decode_tps_p50": "decode_tps",
}
# The LoRA workload (bench/lora.py), each server's figures over its rounds.
LORA_ROWS = (
    Row("mixed tok/s", "mixed_tps", "{:.1f}", True),
    Row("base-only tok/s", "base_tps", "{:.1f}", True),
    Row("mixed / base-only", "mixed_over_base", "{:.2f}", True),
    Row("mixed ITL p50 ms", "mixed_itl_p50_ms", "{:.1f}", None),
    Row("mixed ITL p99 ms", "mixed_itl_p99_ms", "{:.1f}", False),
    Row("base-only ITL p50 ms", "base_itl_p50_ms", "{:.1f}", None),
    Row("base-only ITL p99 ms", "base_itl_p99_ms", "{:.1f}", False),
    Row("mixed ITL max ms", "mixed_itl_max_ms", "{:.0f}", False),
    Row("mixed TTFT p50 ms", "mixed_ttft_p50_ms", "{:.0f}", False),
    Row("streams cut short", "short", "{:.0f}", False, noise=0.0),
    Row("RSS after warm-up MiB", "rss_loaded", "{:.0f}", False, 1.0 / MIB),
)
# The several-models workload (bench/several_models.py), each server's figures; the per-model
# rows follow the cold switch and the alternating tok/s.
MODELS_ROWS = (
    Row("cold-switch TTFT p50 ms", "cold_ttft_p50_ms", "{:.0f}", False),
    Row("alternating tok/s", "alternating_tps", "{:.1f}", True),
    Row("alternating ITL p99 ms", "alternating_itl_p99_ms", "{:.1f}", False),
    Row("RSS both loaded MiB", "rss_both", "{:.0f}", False, 1.0 / MIB),
    Row("processes", "processes", "{:.0f}", None, noise=0.0),
    Row("streams cut short", "short", "{:.0f}", False, noise=0.0),
)
# Each row's rounds (the noise of its "vs previous") and its figure per model.
MODELS_ROUNDS = {
    "cold_ttft_p50_ms": "cold_ttft_ms_rounds",
    "alternating_tps": "alternating_tps_rounds",
    "alternating_itl_p99_ms": "alternating_itl_p99_ms_rounds",
}
MODELS_PER_MODEL = {
    "cold_ttft_p50_ms": ("cold_ttft_p50_ms_by_model", "cold TTFT ms {}"),
    "alternating_tps": ("alternating_stream_tps_by_model", "stream tok/s {}"),
}
# The documents workload (bench/documents.py), each server's figures over its documents; the
# restart rows are the edgeserves' alone.
DOCUMENTS_ROWS = (
    Row("first-pass TTFT p50 ms", "first_ttft_p50_ms", "{:.0f}", False),
    Row("second-pass TTFT p50 ms", "second_ttft_p50_ms", "{:.0f}", False),
    Row("second-pass cached tokens", "second_cached_tokens", "{:.0f}", None),
    Row("prompt tokens", "first_prompt_tokens", "{:.0f}", None),
    Row("disk-tier first pass p50 ms", "disk_first_ttft_p50_ms", "{:.0f}", False),
    Row("after-restart TTFT p50 ms", "restart_ttft_p50_ms", "{:.0f}", False),
    Row("after restart / warm", "restart_over_warm", "{:.2f}", False),
    Row("streams cut short", "short", "{:.0f}", False, noise=0.0),
    Row("idle RSS after a chat MiB", "idle_rss", "{:.0f}", False, 1.0 / MIB),
)
# Each TTFT row's per-document values (the noise of its "vs previous").
DOCUMENTS_ROUNDS = {
    "first_ttft_p50_ms": "first_ttft_ms",
    "second_ttft_p50_ms": "second_ttft_ms",
    "disk_first_ttft_p50_ms": "disk_first_ttft_ms",
    "restart_ttft_p50_ms": "restart_ttft_ms",
}
DOCUMENTS_RESTART = ("disk_first_ttft_p50_ms", "restart_ttft_p50_ms", "restart_over_warm")
NA = "n/a"
# The per-step overhead: a server's one-stream time per token beyond llama-bench's tg (the
# same build's decode alone), for the servers built on llama.cpp's decode loop.
OVERHEAD_SERVERS = (EDGESERVE, EDGESERVE_BASELINE, LLAMA_SERVER)
# A worsening of the overhead up to this (ms per token) is no regression: jitter near zero.
OVERHEAD_FLOOR_MS = 0.1
# The issue 36 targets for the second model, and the engine's own time per step.
MODEL2_ONE_STREAM = 0.95
MODEL2_STREAMS = 8
OVERHEAD_TARGET_MS = 0.5
SHORT_NAMES = {
    EDGESERVE: "edgeserve",
    EDGESERVE_BASELINE: "es-baseline",
    LLAMA_SERVER: "llama-server",
    LCP_SERVER: "llama_cpp.srv",
}


def run_values(
    runs: list[dict[str, Any]], server: str, c: int, key: str, temperature: float | None = 0.0
) -> list[float]:
    """The values of `key` over the alternated rounds of `server` at `c` and `temperature`."""
    values = [
        r.get(key)
        for r in runs
        if r["server"] == server
        and r["concurrency"] == c
        and r.get("temperature", 0.0) == temperature
    ]
    return [float(v) for v in values if v is not None]


def median_runs(
    runs: list[dict[str, Any]], server: str, c: int, key: str, temperature: float | None = 0.0
) -> float | None:
    """Median over the alternated rounds at `temperature` (0: greedy), a sum for counts of
    cut-short streams."""
    values = run_values(runs, server, c, key, temperature)
    if not values:
        return None
    return float(sum(values)) if key == "short" else float(statistics.median(values))


def _run_key(results: dict[str, Any], key: str) -> tuple[str, float | None]:
    """The run field and temperature of a summary key ("sampled_…": the sampled runs; None
    when there were none, with --sampled-temperature 0)."""
    if key.startswith("sampled_"):
        return key.removeprefix("sampled_"), results["config"].get("sampled_temperature") or None
    return key, 0.0


def summarize(results: dict[str, Any]) -> dict[str, Any]:
    """Per (concurrency, server) medians of the runs, merged with memory figures; the median
    llama-bench run goes to results["llama_bench"]."""
    lb = results.get("llama_bench_runs") or []
    if lb:
        results["llama_bench"] = lb[0] | {
            "tps": statistics.median(r["tps"] for r in lb),
            "stddev": statistics.median(r["stddev"] for r in lb),
            "runs": len(lb),
        }
    out: dict[str, Any] = {}
    for c in results["config"]["concurrency"]:
        level: dict[str, Any] = {}
        for server in results["config"]["servers"]:
            row = {}
            for spec in LOAD_ROWS:
                key, temperature = _run_key(results, spec.key)
                row[spec.key] = median_runs(results["runs"], server, c, key, temperature)
            row.update(results["memory"].get(f"{server}@{c}", {}))
            level[server] = row
        out[str(c)] = level
    return out


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else spec.format(value)


def table(results: dict[str, Any]) -> str:
    """The side-by-side table: one block per concurrency, ratios edgeserve/anchor and, with a
    baseline, edgeserve/previous; then the other workloads and the regressions."""
    return "\n".join(render(results)[0])


def versus_previous(results: dict[str, Any]) -> list[Figure]:
    """Every figure compared with the baseline ([] without one)."""
    return render(results)[1]


def render(results: dict[str, Any]) -> tuple[list[str], list[Figure]]:
    """The table's lines and the figures compared with the baseline on the way."""
    cfg = results["config"]
    servers = [s for s in ALL_SERVERS if s in cfg["servers"]]
    anchors = [s for s in (LLAMA_SERVER, LCP_SERVER) if s in servers and EDGESERVE in servers]
    versus = Versus(EDGESERVE in servers and EDGESERVE_BASELINE in servers)
    head = f"{'':29}" + "".join(f"{SHORT_NAMES[s]:>14}" for s in servers)
    head += "".join(f"{'es/' + SHORT_NAMES[a][:9]:>14}" for a in anchors)
    head += f"{'vs previous':>14}" if versus.active else ""
    lines = [
        f"edgeserve bench: {Path(cfg['model']).name} ({cfg['model_mib']:.0f} MiB), "
        f"{cfg['threads']} threads, ctx {cfg['ctx_size']}, {cfg['max_tokens']} tokens/request, "
        f"prompts ~{cfg['prompt_tokens'] or '?'} tokens, {cfg['rounds']} alternated rounds"
        + (" (quick)" if cfg["quick"] else "")
        + ("; the speed workloads on the second model only" if cfg.get("model2_only") else ""),
        head,
    ]
    tab = _Table(servers, anchors, versus)
    lines += _speed(results, tab)
    m2 = results.get("model2")
    if m2:
        c2 = m2["config"]
        lines.append(
            f"second model {model_name(m2)} ({c2['model_mib']:.0f} MiB, end of generation: "
            f"{', '.join(map(str, c2['eog_ids']))}; template: "
            f"{c2['chat_format'] or 'its own'}), prompts ~{c2['prompt_tokens'] or '?'} tokens"
        )
        lines += _speed(m2, tab, model_name(m2))
    mt = results.get("multi_turn")
    if mt:
        lines.append("multi-turn chat (--parallel 1; turn 2 re-sends turn 1 and its answer)")
        for row in MULTI_TURN_ROWS:
            values = {s: mt[s].get(row.key) if s in mt else None for s in servers}
            lines.append(tab.row(row, values, "multi-turn "))
    lines += _images(results, tab)
    lines += _lora(results, tab)
    lines += _several_models(results, tab)
    lines += _documents(results, tab)
    lines += _long_context(results, tab)
    for part in (_scoring, _embeddings, _grounded, _structured, _soak, _abuse):
        lines += part(results, versus)
    lines.append(
        "ratios: higher is better for tok/s, lower is better for TTFT, latency and RSS"
        + ("; vs previous: edgeserve / edgeserve-baseline" if versus.active else "")
    )
    noisy = results.get("noisy_runs") or []
    if noisy:
        lines.append(
            f"WARNING: other processes used > 0.2 CPU during {len(noisy)} run(s): "
            + ", ".join(noisy[:6])
            + " (numbers are noisy; run again on a quiet machine)"
        )
    lines += versus.text((cfg.get("baseline") or {}).get("revision"))
    return lines, versus.figures


class _Table:
    """Formats the table's lines: each server's value, edgeserve / each anchor, and
    edgeserve / baseline (recorded in `versus`)."""

    def __init__(self, servers: list[str], anchors: list[str], versus: Versus) -> None:
        self.servers = servers
        self.anchors = anchors
        self.versus = versus

    def row(
        self,
        row: Row,
        values: dict[str, float | None],
        prefix: str,
        noise: float | None = None,
        na: Collection[str] = (),
    ) -> str:
        """One line; `prefix` names the block in the regressions list, `noise` replaces the
        row's own (the rounds' spread); the servers in `na` cannot run the block ("n/a", in
        their ratios too, and no figure for the regressions)."""
        vals = {s: _scaled(v, row.scale) for s, v in values.items()}
        shown_vals = {s: NA if s in na else _fmt(vals[s], row.spec) for s in self.servers}
        line = f"  {row.label:27}" + "".join(f"{shown_vals[s]:>14}" for s in self.servers)
        line += "".join(
            f"{NA if {EDGESERVE, a} & set(na) else ratio(vals.get(EDGESERVE), vals.get(a)):>14}"
            for a in self.anchors
        )
        if noise is None:
            noise = NOISE if row.noise is None else row.noise
        ours, base = vals.get(EDGESERVE), vals.get(EDGESERVE_BASELINE)
        label = prefix + row.label.strip()
        figure = Figure(label, ours, base, row.higher_is_better, row.spec, noise, row.floor)
        if self.versus.active and set(EDGESERVES) & set(na):
            return line + f"{NA:>14}"
        shown = self.versus.ratio(figure)
        return line + ("" if shown is None else f"{shown:>14}")


def model_name(part: dict[str, Any]) -> str:
    """The name of the model of a results part (the top level or "model2"): its file's name
    without `.gguf`."""
    return Path(part["config"]["model"]).name.removesuffix(".gguf")


def overhead_ms(stream_tps: float | None, tg_tps: float | None) -> float | None:
    """A server's time per token beyond llama-bench's at one stream (ms):
    1000 / per-stream tok/s - 1000 / llama-bench tg tok/s; None when either is missing."""
    if not stream_tps or not tg_tps:
        return None
    return 1000.0 / stream_tps - 1000.0 / tg_tps


def _speed(part: dict[str, Any], tab: _Table, model: str | None = None) -> list[str]:
    """The speed workloads of one model: a block per concurrency, llama-bench, the per-step
    overhead and the long prompts. `model` names the second model in the titles and in the
    figures' labels (None: the default model, unnamed as before)."""
    title = f"{model}: " if model else ""
    prefix = f"{model} " if model else ""
    cfg = part["config"]
    lines = []
    for c, level in part["summary"].items():
        lines.append(
            f"{title}concurrency {c} (--parallel {c}, {cfg['requests'][c]} requests per round)"
        )
        for row in LOAD_ROWS + MEMORY_ROWS:
            values = {s: (level.get(s) or {}).get(row.key) for s in tab.servers}
            if row not in RUN_ROWS + SAMPLED_ROWS and all(v is None for v in values.values()):
                continue  # a case that did not run on this model, a figure not measured
            noise = row.noise
            if noise is None and row in LOAD_ROWS:
                key, temperature = _run_key(part, row.key)
                noise = rounds_noise(
                    *(run_values(part["runs"], s, int(c), key, temperature) for s in EDGESERVES)
                )
            lines.append(tab.row(row, values, f"{prefix}c={c} ", noise))
    lb = part.get("llama_bench")
    if lb:
        lines.append(
            f"{title}llama-bench tg{lb['tokens']} at depth {lb['depth']}: {lb['tps']:.1f} "
            f"tok/s (median of {lb['runs']} alternated runs of {lb['reps']} reps)"
        )
    lines += _overhead(part, tab, title, prefix)
    lines += _long_prompt(part, tab, title, prefix)
    return lines


def _overhead(part: dict[str, Any], tab: _Table, title: str, prefix: str) -> list[str]:
    """Each server's per-step overhead at one stream, greedy and sampled (`overhead_ms`)."""
    tg = (part.get("llama_bench") or {}).get("tps")
    level = part["summary"].get("1")
    if not tg or level is None:
        return []
    lines = [
        f"{title}per-step overhead at one stream (ms per token: 1000 / per-stream tok/s - "
        f"1000 / llama-bench tg {tg:.1f} tok/s)"
    ]
    for key in ("stream_tps_p50", "sampled_stream_tps_p50"):
        values = {
            s: overhead_ms((level.get(s) or {}).get(key), tg) if s in OVERHEAD_SERVERS else None
            for s in tab.servers
        }
        run_key, temperature = _run_key(part, key)
        noise = rounds_noise(
            *(
                [overhead_ms(v, tg) for v in run_values(part["runs"], s, 1, run_key, temperature)]
                for s in EDGESERVES
            )
        )
        label = "sampled overhead ms/token" if key.startswith("sampled_") else "overhead ms/token"
        row = Row(label, key, "{:.2f}", False, floor=OVERHEAD_FLOOR_MS)
        lines.append(tab.row(row, values, f"{prefix}c=1 ", noise))
    return lines


def _long_prompt(part: dict[str, Any], tab: _Table, title: str, prefix: str) -> list[str]:
    """The long-prompt workload: TTFT per size of each server, the ratios; its prompt tokens."""
    lp = part.get("long_prompt")
    if not lp:
        return []
    na = [s for s in tab.servers if s not in lp]
    lines = [
        f"{title}long prompts (new text each round, --parallel {lp['parallel']}, --ctx-size "
        f"{lp['ctx']}, {lp['max_tokens']} tokens generated; median of {lp['rounds']} rounds)"
    ]
    for size in lp["sizes"]:
        figures = {s: (lp.get(s) or {}).get(str(size)) or {} for s in tab.servers}
        noise = rounds_noise(*(figures.get(s, {}).get("ttft_ms") or [] for s in EDGESERVES))
        for row, row_noise in (
            (Row(f"TTFT p50 ms ~{size} tokens", "ttft_p50_ms", "{:.0f}", False), noise),
            (Row(f"prompt tokens ~{size}", "prompt_tokens", "{:.0f}", None), None),
            (Row(f"cut short ~{size}", "short", "{:.0f}", False, noise=0.0), None),
        ):
            values = {s: figures[s].get(row.key) for s in tab.servers}
            lines.append(tab.row(row, values, f"{prefix}long prompt ", row_noise, na))
    return lines


def _long_context(results: dict[str, Any], tab: _Table) -> list[str]:
    """RSS after one chat with a long context, per --parallel."""
    lc = results.get("long_context")
    if not lc:
        return []
    parallels = sorted({int(key.rsplit("@", 1)[1]) for key in lc}, reverse=True)
    ctx = next(iter(lc.values()))["ctx"]
    lines = [f"long context (--ctx-size {ctx}; RSS after one chat)"]
    for c in parallels:
        for label, key in (("RSS MiB", "rss"), ("RSS peak MiB", "rss_peak")):
            row = Row(f"{label} --parallel {c}", key, "{:.0f}", False, 1.0 / MIB)
            values = {s: (lc.get(f"{s}@{c}") or {}).get(key) for s in tab.servers}
            lines.append(tab.row(row, values, "long context "))
    return lines


def _images(results: dict[str, Any], tab: _Table) -> list[str]:
    """The images block: each server's figures, edgeserve / llama-server and, where the
    baseline takes images, edgeserve / previous; "n/a" for a server that cannot."""
    im = results.get("images")
    if not im:
        return []
    na = im.get("unsupported") or {}
    lines = [
        f"images (one {im['width']}x{im['height']} PNG of {im['png_bytes'] / 1024:.0f} KiB per "
        f"request, --parallel {im.get('parallel', 1)}, {im['max_tokens']} tokens; "
        f"{im['requests']} new images, each "
        f"sent twice; --mmproj {Path(im['mmproj']).name})"
    ]
    for row in IMAGE_ROWS:
        noise = row.noise
        rounds_key = IMAGE_ROUNDS.get(row.key)
        if rounds_key is not None:
            noise = rounds_noise(*((im.get(s) or {}).get(rounds_key) or [] for s in EDGESERVES))
        values = {s: (im.get(s) or {}).get(row.key) for s in tab.servers}
        lines.append(tab.row(row, values, "images ", noise, na))
    photo = im.get("photo")
    if photo:
        size = f"{photo['width']}x{photo['height']}"
        for kind in tab.servers:
            beside = (im.get(kind) or {}).get("photo")
            if beside:
                error = f" ({beside['error']})" if beside.get("error") else ""
                lines.append(
                    f"  {kind}: a {size} photo beside a stream: the stream's longest gap "
                    f"{_secs(beside['max_gap_s'])}, the photo's TTFT "
                    f"{_secs(beside['photo_ttft_s'])}{error}"
                )
    for kind, reason in na.items():
        lines.append(f"  {kind} n/a: {reason}")
    return lines


def _lora(results: dict[str, Any], tab: _Table) -> list[str]:
    """The LoRA block: each server's mixed and base-only figures, edgeserve / llama-server
    and, where the baseline serves adapters, edgeserve / previous; each set's share of the
    mixed load, the warm-up answers' check, the memory case; "n/a" for a server that cannot."""
    lo = results.get("lora")
    if not lo:
        return []
    na = lo.get("unsupported") or {}
    lines = [
        f"LoRA adapters (base + 2 tiny adapters, --parallel {lo['parallel']}: {lo['streams']} "
        f"streams, mixed = 2 per set (base, a, b), base-only = all on the base; "
        f"{lo['requests']} request(s) per stream, {lo['max_tokens']} tokens; ITL: inter-token)"
    ]
    for row in LORA_ROWS:
        noise = row.noise
        if noise is None and row.key != "rss_loaded":
            noise = rounds_noise(
                *((lo.get(s) or {}).get(f"{row.key}_rounds") or [] for s in EDGESERVES)
            )
        values = {s: (lo.get(s) or {}).get(row.key) for s in tab.servers}
        lines.append(tab.row(row, values, "lora ", noise, na))
    for kind in tab.servers:
        per_set = (lo.get(kind) or {}).get("mixed_per_set") or {}
        if kind in na or not per_set:
            continue
        names = list(per_set)
        speeds = " / ".join(_fmt(per_set[n].get("tps"), "{:.1f}") for n in names)
        firsts = " / ".join(_fmt(per_set[n].get("ttft_p50_ms"), "{:.0f}") for n in names)
        gaps = " / ".join(_fmt(per_set[n].get("itl_max_ms"), "{:.0f}") for n in names)
        lines.append(
            f"  {kind} mixed, per set ({' / '.join(names)}): {speeds} tok/s, "
            f"TTFT p50 {firsts} ms, longest gap {gaps} ms"
        )
    check = lo.get("answers")
    if check:
        changed = ", ".join(
            f"{kind} {n}/{len(lo['adapters'])}" for kind, n in check["adapters_changed"].items()
        )
        alike = (
            f"; the servers answer alike under {check['sets_alike']}/{check['sets']} sets"
            if check.get("sets_alike") is not None
            else ""
        )
        lines.append(f"  warm-up: adapters that change the base's answer: {changed}{alike}")
    mem = lo.get("memory")
    if mem:
        lines += _lora_memory(mem)
    for kind, reason in na.items():
        lines.append(f"  {kind} n/a: {reason}")
    return lines


def _several_models(results: dict[str, Any], tab: _Table) -> list[str]:
    """The several-models block: each server's cold switch, alternating runs and RSS with both
    loaded (each model's share below), edgeserve / llama-server and, where the baseline has a
    catalogue, edgeserve / previous; each edgeserve's one-model budget case; "n/a" for a
    server that cannot."""
    mo = results.get("models")
    if not mo:
        return []
    na = mo.get("unsupported") or {}
    files = " + ".join(f"{m} {info['mib']:.0f} MiB" for m, info in mo["models"].items())
    lines = [
        f"several models ({files} in one --models-dir: edgeserve's catalogue, llama-server's "
        f"router; --parallel {mo['parallel']} each; alternating: a stream per model, "
        f"{mo['requests']} request(s) of {mo['max_tokens']} tokens each; cold switch: every "
        f"model unloaded, then {mo['switch_tokens']} tokens; {mo['rounds']} rounds)"
    ]
    for row in MODELS_ROWS:
        rounds = MODELS_ROUNDS.get(row.key)
        noise = row.noise
        if rounds is not None:
            noise = rounds_noise(*((mo.get(s) or {}).get(rounds) or [] for s in EDGESERVES))
        values = {s: (mo.get(s) or {}).get(row.key) for s in tab.servers}
        lines.append(tab.row(row, values, "models ", noise, na))
        nested, label = MODELS_PER_MODEL.get(row.key, (None, ""))
        for model_id in mo["models"] if nested else ():
            sub = Row("  " + label.format(model_id), row.key, row.spec, row.higher_is_better)
            values = {s: ((mo.get(s) or {}).get(nested) or {}).get(model_id) for s in tab.servers}
            lines.append(tab.row(sub, values, "models ", None, na))
    for kind in tab.servers:
        figures = mo.get(kind) or {}
        loaded = figures.get("statuses") or {}
        if any(status != "loaded" for status in loaded.values()):
            shown = ", ".join(f"{m} {status}" for m, status in loaded.items())
            lines.append(f"  {kind}: not every model loaded when its RSS was read ({shown})")
        if "budget" in figures:
            lines.append(_budget_line(kind, mo, tab.versus))
    for kind, reason in na.items():
        lines.append(f"  {kind} n/a: {reason}")
    return lines


def _documents(results: dict[str, Any], tab: _Table) -> list[str]:
    """The documents block: each server's first- and second-pass TTFT, the edgeserves' after a
    restart on their disk tier, the idle RSS; edgeserve / llama-server and / previous; "n/a"
    for a server that did not run, and why a restart case was skipped."""
    do = results.get("documents")
    if not do:
        return []
    na = do.get("unsupported") or {}
    skipped = do.get("restart_skipped") or {}
    lines = [
        f"documents ({do['count']} never-seen documents of ~{do['doc_tokens']} tokens, asked in "
        f"turn, then each again with another question; --parallel {do['parallel']}, --ctx-size "
        f"{do['ctx']}: more than the KV holds; {do['max_tokens']} tokens generated; after "
        "restart: the edgeserves alone with --prompt-cache-dir, stopped and started between "
        f"the passes; idle RSS: a second after one chat at --parallel {do['idle_parallel']})"
    ]
    for row in DOCUMENTS_ROWS:
        rounds = DOCUMENTS_ROUNDS.get(row.key)
        noise = row.noise
        if rounds is not None:
            noise = rounds_noise(*((do.get(s) or {}).get(rounds) or [] for s in EDGESERVES))
        values = {s: (do.get(s) or {}).get(row.key) for s in tab.servers}
        missing = {**na, **skipped} if row.key in DOCUMENTS_RESTART else na
        lines.append(tab.row(row, values, "documents ", noise, missing))
    for kind in tab.servers:
        figures = do.get(kind) or {}
        if "disk_bytes" in figures:
            lines.append(
                f"  {kind} disk tier: {_mib(figures['disk_bytes']):.0f} MiB in --prompt-cache-dir "
                f"after the first pass; the stop (SIGTERM) exited {figures['stop_exit_code']}"
            )
        errors = [e for key, found in figures.items() if key.endswith("_errors") for e in found]
        if errors:
            lines.append(f"  {kind} first error: {errors[0]}")
    for kind, reason in skipped.items():
        lines.append(f"  {kind} after restart: skipped ({reason})")
    if do.get("idle_rss_error"):
        lines.append(f"  idle RSS not measured: {do['idle_rss_error']}")
    for kind, reason in na.items():
        lines.append(f"  {kind} n/a: {reason}")
    return lines


def _budget_line(kind: str, mo: dict[str, Any], versus: Versus) -> str:
    """An edgeserve's one-model budget case in a line (edgeserve's with "vs previous" where
    the baseline ran it too)."""
    bu = mo[kind]["budget"]
    if bu.get("error"):
        return f"  {kind} within a one-model budget: not measured: {bu['error']}"
    note = ""
    theirs = (mo.get(EDGESERVE_BASELINE) or {}).get("budget") or {}
    if kind == EDGESERVE and theirs and not theirs.get("error"):
        peak = (_mib(bu["rss_peak"]), _mib(theirs["rss_peak"]))
        note = versus.note(Figure("models budget peak RSS MiB", *peak, False, "{:.0f}"))
        versus.ratio(Figure("models budget requests failed", bu["errors"], theirs["errors"],
                            False, "{:.0f}", noise=0.0))  # fmt: skip
    estimated = ", ".join(f"{m} ~{_mib(v):.0f}" for m, v in bu["estimated"].items())
    return (
        f"  {kind} within a one-model budget (--models-memory {_mib(bu['budget']):.0f} MiB; "
        f"estimated {estimated} MiB): {bu['requests']} requests one at a time, the models "
        f"alternating: {bu['errors']} failed or cut short; peak RSS "
        f"{_fmt(_mib(bu['rss_peak']), '{:.0f}')} MiB (bound: budget + 10% = "
        f"{_mib(bu['bound']):.0f} MiB; {_fmt(_mib(bu['rss_start']), '{:.0f}')} MiB before the "
        f"first request; after the answers: {_rss_range(bu.get('rss_after') or [])}), TTFT "
        f"p50 {_fmt(bu['ttft_p50_ms'], '{:.0f}')} ms{note}"
        + (f"; first error: {bu['error_samples'][0]}" if bu["error_samples"] else "")
    )


def _rss_range(values: list[int]) -> str:
    """RSS samples in a few words: the first, the largest and the last, in MiB."""
    if not values:
        return "not read"
    return (
        f"first {_mib(values[0]):.0f}, largest {_mib(max(values)):.0f}, last "
        f"{_mib(values[-1]):.0f} MiB"
    )


def _lora_memory(mem: dict[str, Any]) -> list[str]:
    """The one edgeserve with base + a + b against three (base, base + a, base + b)."""
    if mem.get("error"):
        return [f"  memory case not measured: {mem['error']}"]

    def figures(m: dict[str, Any]) -> str:
        return (
            f"RSS {_fmt(_mib(m.get('rss')), '{:.0f}')} MiB (PSS "
            f"{_fmt(_mib(m.get('pss')), '{:.0f}')}, anonymous "
            f"{_fmt(_mib(m.get('rss_anon')), '{:.0f}')})"
        )

    ratios = mem.get("one_over_three") or {}
    shown = ", ".join(
        f"{label} {_fmt(ratios.get(key), '{:.2f}')}"
        for label, key in (("RSS", "rss"), ("PSS", "pss"), ("anonymous", "rss_anon"))
    )
    each = "; ".join(
        f"{label} {_fmt(_mib(m.get('rss')), '{:.0f}')}" for label, m in mem["three"].items()
    )
    return [
        f"  memory, edgeserve --parallel {mem.get('parallel', '?')} after a request under each "
        f"of its sets: one process with base + a + b: {figures(mem['one'])}",
        f"    three processes ({each} MiB RSS): {figures(mem['three_total'])} together; "
        f"one / three: {shown}",
    ]


def _pair(per_kind: dict[str, Any], key: str) -> tuple[Any, Any]:
    """edgeserve's and the baseline's `key` in a dict keyed by server kind."""
    ours, base = ((per_kind.get(kind) or {}).get(key) for kind in EDGESERVES)
    return ours, base


def _scoring(results: dict[str, Any], versus: Versus) -> list[str]:
    """The scoring case: each edgeserve against the Llama loop."""
    sc = results.get("scoring")
    if not sc:
        return []
    note = versus.note(Figure("scoring texts/s", *_pair(sc, "texts_per_s"), True))
    versus.ratio(Figure("scoring max |diff|", *_pair(sc, "max_abs_diff"), False, "{:.1e}",
                        floor=1e-4))  # fmt: skip
    lines = [
        f"scoring {sc['texts']} texts of ~{sc['tokens_per_text']:.0f} tokens, "
        f"Llama(logits_all) loop {sc['loop_texts_per_s']:.1f} texts/s:"
    ]
    for kind in (k for k in EDGESERVES if k in sc):
        r = sc[kind]
        lines.append(
            f"  {kind}: {r['texts_per_s']:.1f} texts/s, ratio {r['ratio']:.2f}x, "
            f"max |diff| {r['max_abs_diff']:.1e}" + (note if kind == EDGESERVE else "")
        )
    return lines


def _embeddings(results: dict[str, Any], versus: Versus) -> list[str]:
    """Texts/s of each server, the ratios, each one's distance to edgeserve's vectors."""
    em = results.get("embeddings")
    if not em:
        return []
    lines = [f"embeddings, batches of {em['texts']} texts of {em['words_per_text']} words:"]
    ours = em.get(EDGESERVE) or {}
    rounds = _pair(em, "texts_per_s_rounds")
    noise = rounds_noise(*(r or [] for r in rounds))
    note = versus.note(Figure("embeddings texts/s", *_pair(em, "texts_per_s"), True,
                              noise=noise))  # fmt: skip
    for kind in (k for k in ALL_SERVERS if k in em):
        r = em[kind]
        extra = []
        if kind == EDGESERVE:
            extra.append(note.removeprefix(", "))
        elif kind in (LLAMA_SERVER, LCP_SERVER):
            extra.append(f"es/{kind} {ratio(ours.get('texts_per_s'), r['texts_per_s'])}")
        if "max_cosine_distance" in r:
            extra.append(f"max cosine distance to edgeserve {r['max_cosine_distance']:.1e}")
        shown = f" ({', '.join(e for e in extra if e)})" if any(extra) else ""
        lines.append(f"  {kind}: {r['texts_per_s']:.1f} texts/s{shown}")
    return lines


def _grounded(results: dict[str, Any], versus: Versus) -> list[str]:
    """Tokens/s per prompt of each variant, the ratios to llama-server and to the baseline."""
    lines = []
    for c, level in results.get("grounded", {}).items():
        lines.append(f"grounded workload (copy/quote/rewrite a passage, greedy) at c={c}, tok/s:")
        plain = level.get("llama-server")
        for label, r in level.items():
            speeds = " / ".join(f"{v:.1f}" for v in r["tok_s"])
            versus_ls = (
                " ("
                + " / ".join(ratio(v, b) for v, b in zip(r["tok_s"], plain["tok_s"], strict=True))
                + " x llama-server)"
                if plain and label != "llama-server"
                else ""
            )
            differ = r.get("differ_from_no_spec")
            note = (
                f"; {differ} of {len(r['texts'])} answers differ without speculation"
                if differ
                else ""
            )
            if kind_of(label) == EDGESERVE:
                shown = _grounded_previous(label, level, c, versus)
                note += f"; vs previous {shown}" if shown else ""
            lines.append(f"  {label}: {speeds}{versus_ls}{note}")
    return lines


def _grounded_previous(label: str, level: dict[str, Any], c: str, versus: Versus) -> str:
    """edgeserve's variant `label` against the baseline's, prompt by prompt ("" without)."""
    ours = level[label]
    base = level.get(EDGESERVE_BASELINE + label.removeprefix(EDGESERVE)) or {}
    shown = []
    for i, value in enumerate(ours["tok_s"]):
        base_values = base.get("tok_s") or []
        noise = rounds_noise(
            *([r[i] for r in side.get("tok_s_rounds") or []] for side in (ours, base))
        )
        figure = Figure(
            f"grounded c={c} {label} prompt {i + 1} tok/s",
            value,
            base_values[i] if i < len(base_values) else None,
            True,
            noise=noise,
        )
        shown.append(versus.ratio(figure))
    return " / ".join(s for s in shown if s is not None)


def _structured(results: dict[str, Any], versus: Versus) -> list[str]:
    """Milliseconds per constrained token and invalid answers; the grammar passes' costs."""
    st = results.get("structured")
    if not st:
        return []
    note = versus.note(Figure("structured ms per token", *_pair(st, "ms_per_token"), False))
    versus.ratio(Figure("structured invalid answers", *_pair(st, "invalid"), False, "{:.0f}",
                        noise=0.0))  # fmt: skip
    lines = ["structured output (json_schema, temperature 1, full distribution):"]
    for kind, r in st.items():
        if kind == "refused_token_ms":
            continue
        lines.append(
            f"  {kind}: {r['ms_per_token']:.1f} ms per token over {r['tokens']} tokens, "
            f"{r['stopped']}/{r['answers']} answers stopped, {r['invalid']} invalid"
            + (note if kind == EDGESERVE else "")
        )
    for state, ms in st["refused_token_ms"].items():
        lines.append(
            f"  grammar pass after {state!r}: one token {ms['one_token']:.3f} ms, 4096 "
            f"candidates {ms['head_4096']:.2f} ms, whole vocabulary {ms['vocabulary']:.1f} ms"
        )
    return lines


def _soak(results: dict[str, Any], versus: Versus) -> list[str]:
    """Each edgeserve's RSS over the soak."""
    sk = results.get("soak")
    if not sk:
        return []
    end = [_mib(v) for v in _pair(sk, "rss_end")]
    growth = [_mib(v) for v in _pair(sk, "rss_growth")]
    note = versus.note(Figure("soak RSS at the end MiB", *end, False, "{:.0f}"))
    versus.ratio(Figure("soak RSS growth MiB", *growth, False, "{:+.1f}", noise=0.0,
                        floor=SOAK_GROWTH_FLOOR_MIB))  # fmt: skip
    lines = []
    for kind in (k for k in EDGESERVES if k in sk):
        r = sk[kind]
        lines.append(
            f"soak, {kind}: {r['requests']} mixed requests at concurrency {r['concurrency']}: "
            f"RSS {_mib(r['rss_base']):.0f} MiB after the warm-up -> {_mib(r['rss_end']):.0f}"
            f" MiB at the end ({_mib(r['rss_growth']):+.1f} MiB); "
            + ", ".join(f"{k}: {v}" for k, v in r["outcomes"].items())
            + (note if kind == EDGESERVE else "")
        )
    return lines


def _abuse(results: dict[str, Any], versus: Versus) -> list[str]:
    """Each edgeserve's idle CPU after a disconnect and a stream's gaps beside hostile
    requests."""
    ab = results.get("abuse")
    if not ab:
        return []
    healthy = [None if v is None else float(v) for v in _pair(ab, "healthy_after")]
    figures = {
        "idle CPU": Figure("abuse idle CPU % after a disconnect",
                           *_pair(ab, "idle_cpu_pct_after_disconnect"), False, floor=1.0),
        "longest gap": Figure("abuse longest gap s beside hostile requests",
                              *_pair(ab, "max_gap_s_during"), False, "{:.2f}", floor=0.1),
        "healthy": Figure("abuse healthy after", *healthy, True, "{:.0f}", noise=0.0),
    }  # fmt: skip
    shown = {name: versus.ratio(figure) for name, figure in figures.items()}
    note = (
        "; vs previous: " + ", ".join(f"{name} {r}" for name, r in shown.items())
        if versus.active
        else ""
    )
    lines = []
    for kind in (k for k in EDGESERVES if k in ab):
        r = ab[kind]
        hostile = ", ".join(
            f"{name} {h['status']} in {h['seconds']:.1f} s" for name, h in r["hostile"].items()
        )
        lines.append(
            f"abuse, {kind}: idle CPU after a disconnect "
            f"{r['idle_cpu_pct_after_disconnect']:.1f}%; a stream's longest gap "
            f"{_secs(r['max_gap_s_during'])} while hostile requests ran "
            f"({_secs(r['max_gap_s_before'])} before): {hostile}; "
            f"healthy after: {r['healthy_after']}" + (note if kind == EDGESERVE else "")
        )
    return lines


def _scaled(value: float | None, scale: float) -> float | None:
    return None if value is None else value * scale


def _mib(value: float | None) -> float | None:
    return _scaled(value, 1.0 / MIB)


def targets(results: dict[str, Any]) -> list[tuple[str, bool | None, str]]:
    """PRODUCT.md section 7's targets: (what, met? or None when not measured, evidence)."""
    summ = results["summary"]
    cfg = results["config"]
    out: list[tuple[str, bool | None, str]] = []

    def get(c: int, server: str, key: str) -> float | None:
        return summ.get(str(c), {}).get(server, {}).get(key)

    one_es = get(1, EDGESERVE, "stream_tps_p50")
    one_ls = get(1, LLAMA_SERVER, "stream_tps_p50")
    tg = (results.get("llama_bench") or {}).get("tps")
    if cfg["concurrency"]:  # not with the second model alone
        out.append(_cmp("one stream tok/s >= llama-server", one_es, one_ls, 1.0))
        out.append(_cmp("one stream tok/s >= 97% of llama-bench tg", one_es, tg, 0.97))
        out.append(
            _cmp(
                "8 streams aggregate >= llama-server --parallel 8",
                get(8, EDGESERVE, "aggregate_tps"),
                get(8, LLAMA_SERVER, "aggregate_tps"),
                1.0,
            )
        )
    for c, key, what in (
        (1, "sampled_stream_tps_p50", "sampled one stream tok/s"),
        (8, "sampled_aggregate_tps", "sampled 8 streams aggregate"),
    ):
        ours, theirs = get(c, EDGESERVE, key), get(c, LLAMA_SERVER, key)
        if ours is not None:
            out.append(_cmp(f"{what} >= llama-server", ours, theirs, 1.0))
    for c in cfg["concurrency"]:
        es, ls = get(c, EDGESERVE, "ttft_p50_ms"), get(c, LLAMA_SERVER, "ttft_p50_ms")
        out.append(_at_most(f"TTFT p50 <= 1.1 x llama-server's (c={c})", es, ls, 1.1, "ms"))
    for c in cfg["concurrency"]:
        es, ls = get(c, EDGESERVE, "itl_p99_ms"), get(c, LLAMA_SERVER, "itl_p99_ms")
        out.append(_at_most(f"inter-token p99 <= llama-server's (c={c})", es, ls, 1.0, "ms"))
    for c in cfg["concurrency"]:
        es, lcp = get(c, EDGESERVE, "aggregate_tps"), get(c, LCP_SERVER, "aggregate_tps")
        out.append(_cmp(f"faster than llama_cpp.server (c={c})", es, lcp, 1.0, strict=True))
    shorts = [get(c, EDGESERVE, "short") for c in cfg["concurrency"]]
    if any(v is not None for v in shorts):
        total = sum(v or 0 for v in shorts)
        out.append(("no edgeserve stream cut short", total == 0, f"{total:.0f} cut short"))
    limit = cfg["model_mib"] + 100
    for c in cfg["concurrency"]:
        idle = _mib(get(c, EDGESERVE, "rss_idle"))
        out.append(_at_most(f"idle RSS <= model + 100 MiB (--parallel {c})", idle, limit, 1, "MiB"))
    for key, both in (results.get("long_context") or {}).items():
        kind, c = key.rsplit("@", 1)
        if kind == EDGESERVE:
            theirs = (results["long_context"].get(f"{LLAMA_SERVER}@{c}") or {}).get("rss")
            what = f"RSS <= llama-server's at --ctx-size {both['ctx']} --parallel {c}"
            out.append(_at_most(what, _mib(both["rss"]), _mib(theirs), 1.0, "MiB"))
    sk = (results.get("soak") or {}).get(EDGESERVE)
    if sk:
        growth = _mib(sk["rss_growth"]) or 0.0
        out.append(
            (
                f"RSS flat over the {sk['requests']}-request soak (growth <= {SOAK_SLACK_MIB} MiB)",
                growth <= SOAK_SLACK_MIB,
                f"{growth:+.1f} MiB",
            )
        )
    ab = (results.get("abuse") or {}).get(EDGESERVE)
    if ab:
        idle = ab["idle_cpu_pct_after_disconnect"]
        out.append(("idle CPU after a disconnect <= 2%", idle <= 2.0, f"{idle:.1f}%"))
        gap = ab["max_gap_s_during"]
        out.append(
            (
                "a stream's longest gap < 1 s while hostile requests run",
                None if gap is None else gap < 1.0,
                _secs(gap),
            )
        )
        out.append(("healthy after the hostile requests", ab["healthy_after"], ""))
    im = results.get("images")
    if im:
        es, ls = ((im.get(kind) or {}).get("ttft_p50_ms") for kind in (EDGESERVE, LLAMA_SERVER))
        out.append(_at_most("image TTFT p50 <= llama-server's (cold, --mmproj)", es, ls, 1.0, "ms"))
        gap = ((im.get(EDGESERVE) or {}).get("photo") or {}).get("max_gap_s")
        if gap is not None:
            out.append(
                ("a stream's longest gap < 1 s beside a camera photo", gap < 1.0, _secs(gap))
            )
    lo = results.get("lora")
    if lo:
        ours, theirs = ((lo.get(kind) or {}) for kind in (EDGESERVE, LLAMA_SERVER))
        share = ours.get("mixed_over_base")
        out.append(
            (
                "mixed adapters tok/s >= 0.8x base-only",
                None if share is None else share >= 0.8,
                "not measured"
                if share is None
                else f"{share:.2f}x ({_fmt(ours.get('mixed_tps'), '{:.1f}')} vs "
                f"{_fmt(ours.get('base_tps'), '{:.1f}')} tok/s, median of the rounds' ratios)",
            )
        )
        out.append(
            _cmp(
                "mixed adapters tok/s >= llama-server's",
                ours.get("mixed_tps"),
                theirs.get("mixed_tps"),
                1.0,
            )
        )
    out += models_targets(results.get("models"))
    out += documents_targets(results.get("documents"))
    gr = results.get("grounded", {}).get("1", {})
    if "edgeserve" in gr and "llama-server" in gr:
        ours = statistics.median(gr["edgeserve"]["tok_s"])
        plain = statistics.median(gr["llama-server"]["tok_s"])
        best = max(
            (statistics.median(r["tok_s"]) for k, r in gr.items() if k.startswith("llama-server ")),
            default=None,
        )
        out.append(_cmp("grounded c=1 >= 1.5x llama-server without speculation", ours, plain, 1.5))
        if best is not None:
            out.append(_cmp("grounded c=1 >= llama-server's best ngram speculation", ours, best, 1))
    st = results.get("structured")
    if st and "edgeserve" in st:
        invalid = st["edgeserve"]["invalid"]
        out.append(("structured answers all valid JSON", invalid == 0, f"{invalid} invalid"))
    sc = (results.get("scoring") or {}).get(EDGESERVE)
    if sc:
        out.append(("scoring >= 1.5x the Llama loop", sc["ratio"] >= 1.5, f"{sc['ratio']:.2f}x"))
        out.append(
            (
                "scores match the loop to 1e-3",
                sc["max_abs_diff"] <= 1e-3,
                f"{sc['max_abs_diff']:.1e}",
            )
        )
    out += long_prompt_targets(results)
    if results.get("model2"):
        out += model2_targets(results["model2"])
        out += long_prompt_targets(results["model2"], model_name(results["model2"]))
    return out


def models_targets(mo: dict[str, Any] | None) -> list[tuple[str, bool | None, str]]:
    """Issue 37's targets for several models behind one server ([] without the workload):
    the cold switch's TTFT <= llama-server's, the alternating tok/s >= its, the RSS with both
    loaded <= its router's and children's; within a one-model budget, no request failed and
    the peak RSS <= the budget + 10%."""
    if not mo:
        return []
    ours, theirs = ((mo.get(kind) or {}) for kind in (EDGESERVE, LLAMA_SERVER))
    out = [
        _at_most("models: cold-switch TTFT p50 <= llama-server's", ours.get("cold_ttft_p50_ms"),
                 theirs.get("cold_ttft_p50_ms"), 1.0, "ms"),
        _cmp("models: alternating tok/s, both loaded >= llama-server's",
             ours.get("alternating_tps"), theirs.get("alternating_tps"), 1.0),
        _at_most("models: RSS both loaded <= llama-server's router + children",
                 _mib(ours.get("rss_both")), _mib(theirs.get("rss_both")), 1.0, "MiB"),
    ]  # fmt: skip
    bu = ours.get("budget") or {}
    within = "models: alternating requests within a one-model budget"
    failed, peak = f"{within}: 0 failed", f"{within}: peak RSS <= budget + 10%"
    if not bu.get("requests"):
        reason = bu.get("error") or "not measured"
        return [*out, (failed, None, reason), (peak, None, reason)]
    shown = f"{bu['errors']} of {bu['requests']} failed or cut short"
    out.append((failed, bu["errors"] == 0, shown))
    if bu["errors"] == bu["requests"]:  # no model was loaded: the peak says nothing
        return [*out, (peak, None, "not measured: every request failed")]
    out.append(_at_most(peak, _mib(bu["rss_peak"]), _mib(bu["budget"]), BUDGET_SLACK, "MiB"))
    return out


def documents_targets(do: dict[str, Any] | None) -> list[tuple[str, bool | None, str]]:
    """Issue 38's targets for documents asked in turn ([] without the workload): the second
    pass's TTFT <= llama-server's, after a restart on the disk tier <= 2x edgeserve's warm
    second pass (not measured, with the reason, when skipped), and the idle RSS after one chat
    <= 1.1x llama-server's."""
    if not do:
        return []
    ours, theirs = ((do.get(kind) or {}) for kind in (EDGESERVE, LLAMA_SERVER))
    second = "documents: second-pass TTFT p50 <= llama-server's (its host-RAM prompt cache)"
    restart = f"documents: after a restart on the disk tier, TTFT p50 <= {RESTART_FACTOR:g}x warm"
    idle = (f"documents: idle RSS after one chat <= {IDLE_RSS_FACTOR:g}x llama-server's "
            f"(--parallel {do['idle_parallel']}, --ctx-size {do['ctx']})")  # fmt: skip
    skipped = (do.get("restart_skipped") or {}).get(EDGESERVE)
    return [
        _at_most(second, ours.get("second_ttft_p50_ms"), theirs.get("second_ttft_p50_ms"), 1.0,
                 "ms"),
        (restart, None, f"skipped: {skipped}")
        if skipped
        else _at_most(restart, ours.get("restart_ttft_p50_ms"), ours.get("second_ttft_p50_ms"),
                      RESTART_FACTOR, "ms"),
        _at_most(idle, _mib(ours.get("idle_rss")), _mib(theirs.get("idle_rss")), IDLE_RSS_FACTOR,
                 "MiB"),
    ]  # fmt: skip


def model2_targets(part: dict[str, Any]) -> list[tuple[str, bool | None, str]]:
    """Issue 36's targets for the second model against llama-server, on the sampled load
    (greedy without one): one stream >= 0.95x, 8 streams >= 1.0x, TTFT p50 <= 1.1x and
    inter-token p99 <= 1.0x at every concurrency; edgeserve's engine time outside
    llama_decode <= 0.5 ms a step at one stream."""
    name = model_name(part)
    cfg = part["config"]
    temperature = cfg.get("sampled_temperature") or 0.0
    pre, mode = ("sampled_", f"T={temperature:g}") if temperature else ("", "greedy")

    def get(c: int, server: str, key: str) -> float | None:
        return (part["summary"].get(str(c)) or {}).get(server, {}).get(pre + key)

    n = MODEL2_STREAMS
    out = [
        _cmp(
            f"{name}: one stream tok/s >= {MODEL2_ONE_STREAM} x llama-server ({mode})",
            get(1, EDGESERVE, "stream_tps_p50"),
            get(1, LLAMA_SERVER, "stream_tps_p50"),
            MODEL2_ONE_STREAM,
        ),
        _cmp(
            f"{name}: {n} streams aggregate >= llama-server ({mode})",
            get(n, EDGESERVE, "aggregate_tps"),
            get(n, LLAMA_SERVER, "aggregate_tps"),
            1.0,
        ),
    ]
    for c in cfg["concurrency"]:
        es, ls = get(c, EDGESERVE, "ttft_p50_ms"), get(c, LLAMA_SERVER, "ttft_p50_ms")
        out.append(_at_most(f"{name}: TTFT p50 <= 1.1 x llama-server's (c={c}, {mode})", es,
                            ls, 1.1, "ms"))  # fmt: skip
    for c in cfg["concurrency"]:
        es, ls = get(c, EDGESERVE, "itl_p99_ms"), get(c, LLAMA_SERVER, "itl_p99_ms")
        out.append(_at_most(f"{name}: inter-token p99 <= llama-server's (c={c}, {mode})", es,
                            ls, 1.0, "ms"))  # fmt: skip
    out.append(overhead_target(part, name))
    return out


def overhead_target(part: dict[str, Any], name: str) -> tuple[str, bool | None, str]:
    """edgeserve's engine time a step outside llama_decode at one stream <= 0.5 ms: its
    /metrics phase clock over the sampled runs (the greedy ones without a sampled load). Not
    the time per token beyond llama-bench's tg: drafts make that negative on a greedy load,
    and it holds HTTP and the client too; it is given beside, with llama-server's."""
    what = (
        f"{name}: engine time outside llama_decode <= {OVERHEAD_TARGET_MS} ms a step at one stream"
    )
    temperature = part["config"].get("sampled_temperature") or 0.0
    pre, mode = ("sampled_", f"T={temperature:g}") if temperature else ("", "greedy")
    level = part["summary"].get("1") or {}
    ours = (level.get(EDGESERVE) or {}).get(pre + "engine_step_ms")
    if ours is None:
        return (what, None, "not measured")
    tg = (part.get("llama_bench") or {}).get("tps")
    beyond = {
        s: overhead_ms((level.get(s) or {}).get(pre + "stream_tps_p50"), tg)
        for s in (EDGESERVE, LLAMA_SERVER)
    }
    why = f"{ours:.2f} ms ({mode}, /metrics)"
    waited = (level.get(EDGESERVE) or {}).get(pre + "loop_wait_ms")
    if waited is not None:
        why += f", then {waited:.2f} ms waiting for the event loop to send"
    if beyond[EDGESERVE] is not None:
        why += f"; beyond llama-bench's tg: {beyond[EDGESERVE]:.2f} ms a token"
        if beyond[LLAMA_SERVER] is not None:
            why += f", llama-server {beyond[LLAMA_SERVER]:.2f}"
    return (what, ours <= OVERHEAD_TARGET_MS, why)


def long_prompt_targets(
    part: dict[str, Any], name: str | None = None
) -> list[tuple[str, bool | None, str]]:
    """A long prompt's TTFT p50 <= llama-server's, per size ([] without the workload)."""
    lp = part.get("long_prompt") or {}
    out = []
    for size in lp.get("sizes") or ():
        es, ls = ((lp.get(s) or {}).get(str(size), {}).get("ttft_p50_ms")
                  for s in (EDGESERVE, LLAMA_SERVER))  # fmt: skip
        what = f"long-prompt TTFT p50 <= llama-server's (~{size} tokens)"
        out.append(_at_most(f"{name}: {what}" if name else what, es, ls, 1.0, "ms"))
    return out


def _secs(value: float | None) -> str:
    return "not measured" if value is None else f"{value:.2f} s"


def _cmp(
    what: str, ours: float | None, theirs: float | None, factor: float, strict: bool = False
) -> tuple[str, bool | None, str]:
    """ours >= factor × theirs (or > with `strict`)."""
    if ours is None or theirs is None or theirs == 0:
        return (what, None, "not measured")
    ok = ours > factor * theirs if strict else ours >= factor * theirs
    return (what, ok, f"{ours:.1f} vs {theirs:.1f} (ratio {ours / theirs:.2f})")


def _at_most(
    what: str, ours: float | None, bound: float | None, factor: float, unit: str
) -> tuple[str, bool | None, str]:
    """ours <= factor × bound (lower is better)."""
    if ours is None or bound is None or bound == 0:
        return (what, None, "not measured")
    return (
        what,
        ours <= factor * bound,
        f"{ours:.0f} vs {bound:.0f} {unit} (ratio {ours / bound:.2f})",
    )


def targets_text(checks: list[tuple[str, bool | None, str]]) -> str:
    """One line per target."""
    mark = {True: "PASS", False: "FAIL", None: "n/a "}
    return "\n".join(f"  [{mark[ok]}] {what}: {why}" for what, ok, why in checks)


def write_json(results: dict[str, Any], path: Path) -> None:
    """Everything measured, every round included."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(results, indent=2) + "\n")


def write_png(results: dict[str, Any], path: Path) -> None:
    """Six panels: throughput, per-stream speed, TTFT, tail latency, memory, multi-turn TTFT."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cfg = results["config"]
    summ = results["summary"]
    servers = [s for s in ALL_SERVERS if s in cfg["servers"]]
    levels = cfg["concurrency"]
    fig, axes = plt.subplots(2, 3, figsize=(15, 8.5))
    panels = (
        ("aggregate tokens/s", "aggregate_tps"),
        ("per-stream tokens/s (p50)", "stream_tps_p50"),
        ("time to first token p50 (ms)", "ttft_p50_ms"),
        ("inter-token latency p99 (ms)", "itl_p99_ms"),
    )
    for ax, (title, key) in zip(axes.flat, panels, strict=False):
        for server in servers:
            ys = [summ[str(c)][server].get(key) for c in levels]
            ax.plot(levels, [float("nan") if y is None else y for y in ys], "o-", label=server)
        ax.set_title(title)
        ax.set_xlabel("concurrent streams")
        ax.set_xticks(levels)
        ax.grid(alpha=0.3)
    lb = results.get("llama_bench")
    if lb:
        axes.flat[1].axhline(
            lb["tps"], color="gray", ls="--", label=f"llama-bench tg{lb['tokens']}"
        )
    axes.flat[0].legend()
    axes.flat[1].legend()
    ax = axes.flat[4]
    width = 0.8 / max(1, len(servers))
    for i, server in enumerate(servers):
        xs = [j + i * width for j in range(len(levels))]
        idle = [_mib(summ[str(c)][server].get("rss_idle")) or 0 for c in levels]
        peak = [_mib(summ[str(c)][server].get("rss_peak")) or 0 for c in levels]
        ax.bar(xs, peak, width, alpha=0.35, color=f"C{i}")
        ax.bar(xs, idle, width, color=f"C{i}", label=server)
    ax.axhline(cfg["model_mib"] + 100, color="gray", ls="--", label="model + 100 MiB")
    ax.set_xticks([j + width * (len(servers) - 1) / 2 for j in range(len(levels))])
    ax.set_xticklabels([f"--parallel {c}" for c in levels])
    ax.set_title("RSS MiB: idle after load (solid), peak (light)")
    ax.legend(fontsize=8)
    ax = axes.flat[5]
    mt = results.get("multi_turn") or {}
    names = [s for s in servers if s in mt]
    for i, server in enumerate(names):
        ys = [mt[server].get("ttft1_p50_ms") or 0, mt[server].get("ttft2_p50_ms") or 0]
        ax.bar([i * 3, i * 3 + 1], ys, color=[f"C{servers.index(server)}"] * 2)
    ax.set_xticks([i * 3 + d for i in range(len(names)) for d in (0, 1)])
    abbr = {EDGESERVE: "es", EDGESERVE_BASELINE: "es-base", LLAMA_SERVER: "llama-srv",
            LCP_SERVER: "lcp.srv"}  # fmt: skip
    ax.set_xticklabels([f"{abbr[s]}\nturn {t}" for s in names for t in (1, 2)], fontsize=8)
    ax.set_title("multi-turn chat: TTFT p50 (ms)")
    fig.suptitle(
        f"edgeserve bench: {Path(cfg['model']).name}, {cfg['threads']} threads, "
        f"{cfg['max_tokens']} tokens/request" + (" (quick)" if cfg["quick"] else "")
    )
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
