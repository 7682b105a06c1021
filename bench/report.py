"""The bench's outputs: a table with the edgeserve/anchor ratios on stdout, the section 7
targets checked, a JSON file and a PNG chart in bench/results/."""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

from bench.anchors import ALL_SERVERS, EDGESERVE, LCP_SERVER, LLAMA_SERVER

MIB = 1024 * 1024
# "Flat" over the soak: what the allocator may keep of a burst, not a per-request leak.
SOAK_SLACK_MIB = 16
# (label, run field, format, higher is better)
RUN_ROWS = (
    ("aggregate tok/s", "aggregate_tps", "{:.1f}", True),
    ("per-stream tok/s p50", "stream_tps_p50", "{:.1f}", True),
    ("TTFT p50 ms", "ttft_p50_ms", "{:.0f}", False),
    ("TTFT p95 ms", "ttft_p95_ms", "{:.0f}", False),
    ("inter-token p50 ms", "itl_p50_ms", "{:.1f}", False),
    ("inter-token p99 ms", "itl_p99_ms", "{:.1f}", False),
    ("inter-token max ms", "itl_max_ms", "{:.0f}", False),
    ("streams cut short", "short", "{:.0f}", False),
)
# The same load at the sampled temperature (each server's other sampling defaults).
SAMPLED_ROWS = (
    ("sampled aggregate tok/s", "sampled_aggregate_tps", "{:.1f}", True),
    ("sampled per-stream tok/s p50", "sampled_stream_tps_p50", "{:.1f}", True),
    ("sampled inter-token p99 ms", "sampled_itl_p99_ms", "{:.1f}", False),
)
SHORT_NAMES = {EDGESERVE: "edgeserve", LLAMA_SERVER: "llama-server", LCP_SERVER: "llama_cpp.srv"}


def median_runs(
    runs: list[dict[str, Any]], server: str, c: int, key: str, temperature: float = 0.0
) -> float | None:
    """Median over the alternated rounds at `temperature` (0: greedy), a sum for counts of
    cut-short streams."""
    values = [
        r[key]
        for r in runs
        if r["server"] == server
        and r["concurrency"] == c
        and r.get("temperature", 0.0) == temperature
    ]
    values = [v for v in values if v is not None]
    if not values:
        return None
    return float(sum(values)) if key == "short" else float(statistics.median(values))


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
    temperature = results["config"].get("sampled_temperature") or 0.0
    for c in results["config"]["concurrency"]:
        level: dict[str, Any] = {}
        for server in results["config"]["servers"]:
            row = {key: median_runs(results["runs"], server, c, key) for _, key, _, _ in RUN_ROWS}
            for _, key, _, _ in SAMPLED_ROWS:
                row[key] = median_runs(
                    results["runs"], server, c, key.removeprefix("sampled_"), temperature
                )
            row.update(results["memory"].get(f"{server}@{c}", {}))
            level[server] = row
        out[str(c)] = level
    return out


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else spec.format(value)


def _ratio(a: float | None, b: float | None) -> str:
    if a is None or b is None or b == 0:
        return "-"
    return f"{a / b:.2f}"


def table(results: dict[str, Any]) -> str:
    """The side-by-side table: one block per concurrency, ratios edgeserve/anchor."""
    cfg = results["config"]
    servers = [s for s in ALL_SERVERS if s in cfg["servers"]]
    anchors = [s for s in (LLAMA_SERVER, LCP_SERVER) if s in servers and EDGESERVE in servers]
    head = f"{'':29}" + "".join(f"{SHORT_NAMES[s]:>14}" for s in servers)
    head += "".join(f"{'es/' + SHORT_NAMES[a][:9]:>14}" for a in anchors)
    lines = [
        f"edgeserve bench: {Path(cfg['model']).name} ({cfg['model_mib']:.0f} MiB), "
        f"{cfg['threads']} threads, ctx {cfg['ctx_size']}, {cfg['max_tokens']} tokens/request, "
        f"prompts ~{cfg['prompt_tokens'] or '?'} tokens, {cfg['rounds']} alternated rounds"
        + (" (quick)" if cfg["quick"] else ""),
        head,
    ]
    mem_rows = (
        ("RSS loaded MiB", "rss_loaded"),
        ("RSS peak MiB", "rss_peak"),
        ("RSS idle after load MiB", "rss_idle"),
        ("  of which anonymous MiB", "rss_idle_anon"),
        ("  of which file-backed MiB", "rss_idle_file"),
        ("RSS after multi-turn MiB", "rss_after_multi_turn"),
        ("RSS after scoring MiB", "rss_after_scoring"),
    )
    for c, level in results["summary"].items():
        lines.append(f"concurrency {c} (--parallel {c}, {cfg['requests'][c]} requests per round)")
        rows = [(label, key, spec, 1.0) for label, key, spec, _ in RUN_ROWS + SAMPLED_ROWS]
        rows += [(label, key, "{:.0f}", 1.0 / MIB) for label, key in mem_rows]
        rows.append(("idle CPU %", "idle_cpu_pct", "{:.0f}", 1.0))
        for label, key, spec, scale in rows:
            vals = {s: _scaled(level[s].get(key), scale) for s in servers}
            lines.append(_row(label, vals, spec, servers, anchors))
    if results.get("multi_turn"):
        lines.append("multi-turn chat (--parallel 1; turn 2 re-sends turn 1 and its answer)")
        mt = results["multi_turn"]
        for label, key, spec in (
            ("turn 1 TTFT p50 ms", "ttft1_p50_ms", "{:.0f}"),
            ("turn 2 TTFT p50 ms", "ttft2_p50_ms", "{:.0f}"),
            ("turn 2 prompt tokens", "prompt2_tokens", "{:.0f}"),
            ("turn 2 cached tokens", "cached2_tokens", "{:.0f}"),
            ("streams cut short", "short", "{:.0f}"),
        ):
            vals = {s: mt[s].get(key) if s in mt else None for s in servers}
            lines.append(_row(label, vals, spec, servers, anchors))
    lb = results.get("llama_bench")
    if lb:
        lines.append(
            f"llama-bench tg{lb['tokens']} at depth {lb['depth']}: {lb['tps']:.1f} "
            f"tok/s (median of {lb['runs']} alternated runs of {lb['reps']} reps)"
        )
    sc = results.get("scoring")
    if sc:
        lines.append(
            f"scoring {sc['texts']} texts of ~{sc['tokens_per_text']:.0f} tokens: edgeserve "
            f"{sc['edgeserve_texts_per_s']:.1f} texts/s, Llama(logits_all) loop "
            f"{sc['loop_texts_per_s']:.1f} texts/s, ratio {sc['ratio']:.2f}x, "
            f"max |diff| {sc['max_abs_diff']:.1e}"
        )
    em = results.get("embeddings")
    if em:
        kinds = [kind for kind in ("edgeserve", "llama-server") if kind in em]
        speeds = ", ".join(f"{kind} {em[kind]['texts_per_s']:.1f} texts/s" for kind in kinds)
        extra = (
            f", ratio {em['ratio']:.2f}x, max cosine distance {em['max_cosine_distance']:.1e}"
            if "ratio" in em
            else ""
        )
        lines.append(
            f"embeddings, batches of {em['texts']} texts of {em['words_per_text']} words: "
            f"{speeds}{extra}"
        )
    for c, level in results.get("grounded", {}).items():
        lines.append(f"grounded workload (copy/quote/rewrite a passage, greedy) at c={c}, tok/s:")
        base = level.get("llama-server")
        for kind, r in level.items():
            speeds = " / ".join(f"{v:.1f}" for v in r["tok_s"])
            versus = (
                " ("
                + " / ".join(_ratio(v, b) for v, b in zip(r["tok_s"], base["tok_s"], strict=True))
                + " x llama-server)"
                if base and kind != "llama-server"
                else ""
            )
            differ = r.get("differ_from_no_spec")
            note = (
                f"; {differ} of {len(r['texts'])} answers differ without speculation"
                if differ
                else ""
            )
            lines.append(f"  {kind}: {speeds}{versus}{note}")
    st = results.get("structured")
    if st:
        lines.append("structured output (json_schema, temperature 1, full distribution):")
        for kind, r in st.items():
            if kind == "refused_token_ms":
                continue
            lines.append(
                f"  {kind}: {r['ms_per_token']:.1f} ms per token over {r['tokens']} tokens, "
                f"{r['stopped']}/{r['answers']} answers stopped, {r['invalid']} invalid"
            )
        for state, ms in st["refused_token_ms"].items():
            lines.append(
                f"  grammar pass after {state!r}: one token {ms['one_token']:.3f} ms, 4096 "
                f"candidates {ms['head_4096']:.2f} ms, whole vocabulary {ms['vocabulary']:.1f} ms"
            )
    sk = results.get("soak")
    if sk:
        lines.append(
            f"soak: {sk['requests']} mixed requests at concurrency {sk['concurrency']}: edgeserve "
            f"RSS {_mib(sk['rss_base']):.0f} MiB after the warm-up -> {_mib(sk['rss_end']):.0f}"
            f" MiB at the end ({_mib(sk['rss_growth']):+.1f} MiB); "
            + ", ".join(f"{k}: {v}" for k, v in sk["outcomes"].items())
        )
    ab = results.get("abuse")
    if ab:
        hostile = ", ".join(
            f"{name} {r['status']} in {r['seconds']:.1f} s" for name, r in ab["hostile"].items()
        )
        lines.append(
            f"abuse: idle CPU after a disconnect {ab['idle_cpu_pct_after_disconnect']:.1f}%; "
            f"a stream's longest gap {_secs(ab['max_gap_s_during'])} while hostile requests ran "
            f"({_secs(ab['max_gap_s_before'])} before): {hostile}; "
            f"healthy after: {ab['healthy_after']}"
        )
    lines.append("ratios: higher is better for tok/s, lower is better for TTFT, latency and RSS")
    noisy = results.get("noisy_runs") or []
    if noisy:
        lines.append(
            f"WARNING: other processes used > 0.2 CPU during {len(noisy)} run(s): "
            + ", ".join(noisy[:6])
            + " (numbers are noisy; run again on a quiet machine)"
        )
    return "\n".join(lines)


def _row(
    label: str, vals: dict[str, float | None], spec: str, servers: list[str], anchors: list[str]
) -> str:
    """One table line: the value of each server, then edgeserve / each anchor."""
    line = f"  {label:27}" + "".join(f"{_fmt(vals[s], spec):>14}" for s in servers)
    return line + "".join(f"{_ratio(vals.get(EDGESERVE), vals.get(a)):>14}" for a in anchors)


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
    sk = results.get("soak")
    if sk:
        growth = _mib(sk["rss_growth"]) or 0.0
        out.append(
            (
                f"RSS flat over the {sk['requests']}-request soak (growth <= {SOAK_SLACK_MIB} MiB)",
                growth <= SOAK_SLACK_MIB,
                f"{growth:+.1f} MiB",
            )
        )
    ab = results.get("abuse")
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
    sc = results.get("scoring")
    if sc:
        out.append(("scoring >= 2x the Llama loop", sc["ratio"] >= 2, f"{sc['ratio']:.2f}x"))
        out.append(
            (
                "scores match the loop to 1e-3",
                sc["max_abs_diff"] <= 1e-3,
                f"{sc['max_abs_diff']:.1e}",
            )
        )
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
    abbr = {EDGESERVE: "es", LLAMA_SERVER: "llama-srv", LCP_SERVER: "lcp.srv"}
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
