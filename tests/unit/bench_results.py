"""A small made-up bench result (the shape `python -m bench` writes) for the report tests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bench import report
from bench.anchors import EDGESERVE, EDGESERVE_BASELINE, LLAMA_SERVER, Setup
from bench.grounded import no_spec

MIB = 1024 * 1024


def run(server: str, c: int, rnd: int, tps: float, temperature: float = 0.0, **more: Any) -> dict:
    """One load run with plausible figures and aggregate `tps`."""
    return {
        "server": server,
        "concurrency": c,
        "round": rnd,
        "temperature": temperature,
        "aggregate_tps": tps,
        "stream_tps_p50": tps / c,
        "ttft_p50_ms": 100.0,
        "ttft_p95_ms": 120.0,
        "itl_p50_ms": 20.0,
        "itl_p99_ms": 30.0,
        "itl_max_ms": 40.0,
        "short": 0,
    } | more


def results(servers: tuple[str, ...] = (EDGESERVE, EDGESERVE_BASELINE, LLAMA_SERVER)) -> dict:
    """Two rounds at c=1 and c=4, every workload; edgeserve's c=4 aggregate is 20% below the
    baseline's, its c=1 one within the rounds' spread, the rest the same."""
    tps = {  # (server, c) -> aggregate tok/s of round 0 and round 1
        (EDGESERVE, 1): (50.0, 54.0),  # median 52, spread 4/52 = 7.7%
        (EDGESERVE_BASELINE, 1): (53.0, 55.0),  # median 54: 3.7% better, within the spread
        (LLAMA_SERVER, 1): (45.0, 45.0),
        (EDGESERVE, 4): (80.0, 80.0),
        (EDGESERVE_BASELINE, 4): (100.0, 100.0),  # 20% better than edgeserve
        (LLAMA_SERVER, 4): (90.0, 90.0),
    }
    runs = [
        run(server, c, rnd, pair[rnd], temperature)
        for (server, c), pair in tps.items()
        if server in servers
        for rnd in (0, 1)
        for temperature in (0.0, 0.7)
    ]
    memory = {
        f"{server}@{c}": {
            "rss_loaded": 300 * MIB,
            "rss_peak": 320 * MIB,
            "rss_idle": 310 * MIB,
            "idle_cpu_pct": 0.4,
        }
        for server in servers
        for c in (1, 4)
    }
    out: dict[str, Any] = {
        "config": {
            "model": "models/gemma.gguf",
            "model_mib": 241.0,
            "threads": 2,
            "ctx_size": 4096,
            "concurrency": [1, 4],
            "servers": list(servers),
            "max_tokens": 32,
            "requests": {"1": 1, "4": 4},
            "rounds": 2,
            "prompt_words": 64,
            "prompt_tokens": 90,
            "quick": True,
            "sampled_temperature": 0.7,
            "baseline": {"edgeserve": "/x/.venv/bin/edgeserve", "revision": "abc123 Older"}
            if EDGESERVE_BASELINE in servers
            else None,
        },
        "runs": runs,
        "memory": memory,
        "multi_turn": {
            s: {
                "ttft1_p50_ms": 200.0,
                "ttft2_p50_ms": 50.0,
                "prompt2_tokens": 150.0,
                "cached2_tokens": 120.0,
                "short": 0,
            }
            for s in servers
        },
        "llama_bench_runs": [],
        "noisy_runs": [],
    }
    edgeserves = [s for s in (EDGESERVE, EDGESERVE_BASELINE) if s in servers]
    out["scoring"] = {"texts": 8, "tokens_per_text": 30.0, "loop_texts_per_s": 10.0} | {
        s: {"texts_per_s": 25.0, "ratio": 2.5, "max_abs_diff": 1e-5} for s in edgeserves
    }
    out["embeddings"] = {"texts": 16, "words_per_text": 12, "rounds": 2} | {
        s: {"texts_per_s": 40.0, "texts_per_s_rounds": [39.0, 41.0]} for s in servers
    }
    out["grounded"] = {
        "1": {
            label: {
                "tok_s": [30.0, 31.0],
                "tok_s_rounds": [[30.0, 31.0], [30.0, 31.0]],
                "texts": ["a", "b"],
                "differ_from_no_spec": 0,
            }
            for s in servers
            for label in ([s, no_spec(s)] if s != LLAMA_SERVER else [s])
        }
    }
    out["structured"] = {
        s: {"answers": 4, "tokens": 100, "ms_per_token": 5.0, "stopped": 4, "invalid": 0}
        for s in servers
    } | {"refused_token_ms": {"{": {"one_token": 0.01, "head_4096": 0.5, "vocabulary": 20.0}}}
    out["soak"] = {
        s: {
            "requests": 12,
            "concurrency": 4,
            "outcomes": {"stream 200": 12},
            "rss_samples": [],
            "rss_base": 300 * MIB,
            "rss_end": 301 * MIB,
            "rss_growth": MIB,
        }
        for s in edgeserves
    }
    out["long_context"] = {
        f"{s}@{c}": {"rss": rss * MIB, "rss_peak": (rss + 20) * MIB, "ctx": 32768}
        for s, rss in zip(servers, (400, 800, 480), strict=False)
        for c in (4, 1)
    }  # edgeserve 400 MiB, its baseline 800, llama-server 480
    out["abuse"] = {
        s: {
            "idle_cpu_pct_after_disconnect": 0.5,
            "max_gap_s_before": 0.05,
            "max_gap_s_during": 0.2,
            "abuse_s": 3.0,
            "hostile": {"100,001 messages": {"status": 413, "seconds": 0.1}},
            "healthy_after": True,
        }
        for s in edgeserves
    }
    out["summary"] = report.summarize(out)
    return out


def bench_setup(folder: Path) -> Setup:
    """A bench setup with a baseline, its llama.cpp binaries and logs in `folder`."""
    return Setup(
        model=Path("m.gguf"),
        threads=2,
        ctx_size=4096,
        edgeserve=Path(".venv/bin/edgeserve"),
        llamacpp_bin=folder,
        lcp_python=Path("python"),
        logs=folder,
        baseline=Path("/cache/abc/.venv/bin/edgeserve"),
    )


def long_prompt(ttft_ms: dict[str, tuple[float, float]], sizes: tuple[int, int] = (2000, 6000)):
    """A long-prompt result: per server, the TTFT (ms) of each size, the same in both rounds."""
    return {
        "sizes": list(sizes),
        "ctx": 8192,
        "parallel": 1,
        "max_tokens": 4,
        "rounds": 2,
        "tokens_per_word": 2.0,
    } | {
        server: {
            str(size): {
                "ttft_ms": [ms, ms],
                "ttft_p50_ms": ms,
                "prompt_tokens": size,
                "short": 0,
                "errors": [],
            }
            for size, ms in zip(sizes, pair, strict=True)
        }
        for server, pair in ttft_ms.items()
    }


def second_model(
    one_stream: dict[str, float], tg: float = 200.0, temperature: float = 0.7
) -> dict[str, Any]:
    """results["model2"]: c=1 and c=8, each server's one-stream decode speed `one_stream`
    (tok/s, greedy and sampled alike, the same in both rounds; 8 streams: 2x it aggregate),
    llama-bench tg `tg`, TTFT 40 ms and inter-token p99 30 ms everywhere."""
    runs = [
        run(server, c, rnd, tps * (1 if c == 1 else 2), t, stream_tps_p50=tps, ttft_p50_ms=40.0)
        for server, tps in one_stream.items()
        for c in (1, 8)
        for rnd in (0, 1)
        for t in {0.0, temperature}
    ]
    part: dict[str, Any] = {
        "config": {
            "model": "/cache/SmolLM2-135M-Instruct.Q4_1.gguf",
            "model_mib": 86.0,
            "eog_ids": [0, 2, 4],
            "chat_format": None,
            "concurrency": [1, 8],
            "servers": list(one_stream),
            "max_tokens": 32,
            "requests": {"1": 1, "8": 8},
            "prompt_tokens": 120,
            "sampled_temperature": temperature,
        },
        "runs": runs,
        "memory": {},
        "llama_bench_runs": [
            {"tokens": 32, "depth": 120, "reps": 1, "tps": tg, "stddev": 1.0, "round": r}
            for r in (0, 1)
        ],
        "long_prompt": long_prompt({s: (300.0, 1200.0) for s in one_stream}),
    }
    part["summary"] = report.summarize(part)
    return part
