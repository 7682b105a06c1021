"""The bench's several-models workload (bench/several_models.py): the catalogue folder and its
ids, llama-server's preset, the flag probe, the servers' command lines, the budget, GET /models,
the turns and prompts, the process tree, the figures from recorded runs, its report lines ("n/a"
for a baseline without --models-dir), its targets and switches, and its requests against fake
servers."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from bench import load, lora, report, several_models
from bench.__main__ import Bench, parse_args
from bench.anchors import (
    EDGESERVE,
    EDGESERVE_BASELINE,
    LCP_SERVER,
    LLAMA_SERVER,
    Server,
    command,
    cpu_seconds,
    descendants,
    proc_status,
    process_tree,
)
from bench.load import Stream
from tests.unit.bench_results import MIB, bench_setup, results
from tests.unit.fake_chat_server import streaming_chat_app
from tests.unit.test_bench_report import block, lines_of, row
from tests.unit.test_bench_speed_models import vocab_gguf

GEMMA = Path("models/gemma-3-270m-q4_k_m.gguf")
SMOL = Path("/cache/SmolLM2-135M-Instruct.Q4_1.gguf")


def test_each_model_is_named_by_its_file_s_first_word():
    assert several_models.model_ids([GEMMA, SMOL]) == {"gemma": GEMMA, "smollm2": SMOL}
    other = Path("/m/gemma-3-1b-it.Q8_0.gguf")
    assert list(several_models.model_ids([GEMMA, other])) == ["gemma", "gemma-2"]


def test_the_folder_holds_a_link_per_model_and_nothing_stale(tmp_path: Path):
    files = {name: tmp_path / f"{name}-file.gguf" for name in ("a", "b")}
    for path in files.values():
        path.write_bytes(b"GGUF")
    folder = tmp_path / "models-dir"
    folder.mkdir()
    (folder / "old.gguf").write_bytes(b"GGUF")
    assert several_models.write_models_dir(folder, files) == folder
    assert sorted(p.name for p in folder.iterdir()) == ["a.gguf", "b.gguf"]
    assert (folder / "a.gguf").resolve() == files["a"].resolve()
    several_models.write_models_dir(folder, {"b": files["b"]})  # a second run
    assert [p.name for p in folder.iterdir()] == ["b.gguf"]


def test_llama_server_s_preset_gives_a_built_in_template_to_a_gguf_without_one():
    ini = several_models.preset_ini({"gemma": "gemma", "smollm2": None})
    assert ini == "version = 1\n\n[gemma]\njinja = false\nchat-template = gemma\n"
    assert several_models.preset_ini({"smollm2": None}) == "version = 1\n"


@pytest.mark.parametrize(
    ("help_text", "offered"),
    [
        ("  --models-dir DIR    folder of models served side by side", True),
        ("--models-dir PATH                       directory containing models", True),
        ("--models-dir-extra PATH", False),
        ("  --model PATH\n  --models-max N", False),
        ("", False),
    ],
)
def test_a_server_serves_a_folder_when_its_help_lists_models_dir(help_text: str, offered: bool):
    assert several_models.offers_models_dir(help_text) is offered


def fake_binary(path: Path, help_text: str) -> Path:
    path.write_text(f"#!/bin/sh\necho '{help_text}'\n")
    path.chmod(0o755)
    return path


def test_the_baseline_without_a_catalogue_is_found_by_its_help(tmp_path: Path):
    setup = replace(
        bench_setup(tmp_path),
        edgeserve=fake_binary(tmp_path / "edgeserve", "  --models-dir DIR"),
        baseline=fake_binary(tmp_path / "old-edgeserve", "  --model PATH  --lora NAME=PATH"),
    )
    assert several_models.missing_catalogue(EDGESERVE, setup) is None
    reason = several_models.missing_catalogue(EDGESERVE_BASELINE, setup)
    assert reason == "no --models-dir (a version without several models)"
    missing = replace(setup, edgeserve=tmp_path / "nothing")
    assert "--help failed" in (several_models.missing_catalogue(EDGESERVE, missing) or "")


def test_the_servers_serve_the_folder_instead_of_the_model(tmp_path: Path):
    setup = replace(bench_setup(tmp_path), chat_format="gemma")
    folder = replace(setup, models_dir=tmp_path / "models-dir", chat_format=None)
    ours = command(EDGESERVE, folder, 8000, 1, several_models.server_args(EDGESERVE))
    assert ours[:4] == [
        ".venv/bin/edgeserve",
        "serve",
        "--models-dir",
        str(tmp_path / "models-dir"),
    ]
    assert "--model" not in ours and ours[-1] == "--keep-alive=-1"
    # the rest is the single-model command's
    single = command(EDGESERVE, setup, 8000, 1)
    assert ours[4:-1] == single[4:]
    preset = tmp_path / several_models.PRESET_NAME
    theirs = command(
        LLAMA_SERVER, folder, 8000, 1, several_models.server_args(LLAMA_SERVER, preset)
    )
    assert theirs[1:3] == ["--models-dir", str(tmp_path / "models-dir")]
    assert "-m" not in theirs and "--chat-template" not in theirs  # per model, in the preset
    assert theirs[-2:] == ["--models-preset", str(preset)]
    assert command(LLAMA_SERVER, setup, 8000, 1)[1:3] == ["-m", "m.gguf"]
    with pytest.raises(ValueError, match="serves one model"):
        command(LCP_SERVER, folder, 8000, 1)
    with pytest.raises(ValueError, match="serves one model"):
        several_models.server_args(LCP_SERVER)


def test_the_budget_case_s_arguments():
    assert several_models.server_args(EDGESERVE_BASELINE, budget=512 * MIB) == (
        "--keep-alive=-1",
        "--models-memory",
        str(512 * MIB),
    )
    assert several_models.server_args(LLAMA_SERVER) == ()


def test_the_one_model_budget_fits_the_larger_model_but_not_both():
    estimated = {"gemma": 400 * MIB, "smollm2": 240 * MIB}
    budget = several_models.one_model_budget(estimated)
    assert budget == 520 * MIB
    assert 400 * MIB <= budget < 640 * MIB
    assert several_models.one_model_budget({"b": 240 * MIB, "a": 400 * MIB}) == budget


LISTING = {
    "data": [
        {"id": "gemma", "status": {"value": "loaded"}, "memory": {"estimated": 4, "measured": 3}},
        {"id": "smollm2", "status": {"value": "unloaded"}, "memory": {"estimated": 2}},
        {"id": "broken", "status": {"value": "failed", "failed": True}, "memory": {}},
    ]
}


def test_statuses_and_estimates_of_get_models():
    assert several_models.statuses(LISTING) == {
        "gemma": "loaded",
        "smollm2": "unloaded",
        "broken": "failed",
    }
    assert several_models.estimates(LISTING) == {"gemma": 4, "smollm2": 2}
    # llama-server's router shows no memory
    assert several_models.estimates({"data": [{"id": "x", "status": {"value": "loaded"}}]}) == {}


def test_each_round_switches_to_each_model_once_which_first_alternating():
    ids = ["gemma", "smollm2"]
    assert several_models.switch_order(ids, 0) == ["gemma", "smollm2"]
    assert several_models.switch_order(ids, 1) == ["smollm2", "gemma"]
    assert several_models.switch_order(ids, 2) == ids
    assert several_models.switch_order([], 1) == []


def test_every_request_has_its_own_prompt_apart_from_the_other_workloads():
    alternating = {several_models.alternating_index(rnd, r, w, attempt)
                   for rnd in range(10) for r in range(4) for w in range(2)
                   for attempt in range(2)}  # fmt: skip
    cold = {several_models.cold_index(rnd, which) for rnd in range(10) for which in range(2)}
    budget = {several_models.BUDGET_INDEX + i for i in range(100)}
    assert len(alternating) == 10 * 4 * 2 * 2 and len(cold) == 20
    assert not (alternating & cold or alternating & budget or cold & budget)
    others = {lora.prompt_index(r, m, q, w) for r in range(10) for m in lora.MODES
              for q in range(4) for w in range(lora.PARALLEL)}  # fmt: skip
    others |= {load.load_prompt_index(r, c, q, w, s) for r in range(10) for c in (1, 8)
               for q in range(4) for w in range(c) for s in (False, True)}  # fmt: skip
    assert not (alternating | cold | budget) & others


def test_a_request_names_its_model_and_bans_its_own_eog_ids():
    ours = several_models.body(EDGESERVE, "smollm2", (0, 2), "Hi.", 8)
    theirs = several_models.body(LLAMA_SERVER, "smollm2", (0, 2), "Hi.", 8)
    assert ours["model"] == theirs["model"] == "smollm2"
    assert ours["logit_bias"] == {"0": -100, "2": -100}
    assert theirs["logit_bias"] == [[0, False], [2, False]]
    assert (ours["max_tokens"], ours["temperature"], ours["stream"]) == (8, 0.0, True)


def test_the_processes_below_a_root():
    parents = {1: 0, 10: 1, 11: 10, 12: 10, 13: 12, 20: 1, 30: 99}
    assert descendants(parents, 10) == [11, 12, 13]
    assert descendants(parents, 13) == []
    assert descendants(parents, 1) == [10, 20, 11, 12, 13]


# A child that uses 0.3 s of CPU (the kernel counts it in 10 ms ticks), then sleeps.
BUSY_CHILD = "import time\nwhile time.process_time() < 0.3: pass\ntime.sleep(30)"


def test_a_server_s_memory_and_cpu_count_the_processes_below_it(tmp_path: Path):
    root = (
        "import subprocess, sys, time; "
        f"subprocess.Popen([sys.executable, '-c', {BUSY_CHILD!r}]); time.sleep(30)"
    )
    proc = subprocess.Popen([sys.executable, "-c", root], start_new_session=True)
    try:
        server = Server(LLAMA_SERVER, 1, 0, proc, tmp_path / "log")
        tree = process_tree(proc.pid)
        for _ in range(2400):  # up to two minutes on a busy machine
            if len(tree) == 2 and cpu_seconds(tree[1]) >= 0.25:
                break
            subprocess.run(["sleep", "0.05"], check=True)
            tree = process_tree(proc.pid)
        assert tree[0] == proc.pid and len(tree) == 2
        assert server.cpu() >= cpu_seconds(proc.pid) + 0.25
        rss, processes = server.tree_rss()
        assert processes == 2
        assert rss == server.rss_now() + proc_status(tree[1])["VmRSS"] > server.rss_now()
    finally:
        os.killpg(proc.pid, 9)
        proc.wait()


def recorded(server: str, rnd: int, tps: float, itl_p99: float = 30.0, **more: Any) -> dict:
    """One recorded alternating run (the shape `several_models.alternating` returns)."""
    return {
        "server": server,
        "round": rnd,
        "aggregate_tps": tps,
        "itl_p99_ms": itl_p99,
        "short": 0,
        "errors": [],
        "per_model": {
            "gemma": {"tps": tps / 4, "stream_tps_p50": tps / 2},
            "smollm2": {"tps": 3 * tps / 4, "stream_tps_p50": 3 * tps / 2},
        },
    } | more


def switch(server: str, rnd: int, model: str, ms: float | None, error: str | None = None) -> dict:
    stream = Stream(ttft=None if ms is None else ms / 1000.0, tokens=8, short=error is not None,
                    error=error)  # fmt: skip
    return several_models.cold_record(server, rnd, model, stream)


def test_summarize_from_recorded_runs_and_switches():
    runs = [
        recorded(EDGESERVE, 1, 60.0, itl_p99=50.0),
        recorded(EDGESERVE, 0, 40.0, short=1, errors=["HTTP 500: x"]),
        recorded(LLAMA_SERVER, 0, 10.0),
    ]
    cold = [
        switch(EDGESERVE, 0, "gemma", 900.0),
        switch(EDGESERVE, 0, "smollm2", 300.0),
        switch(EDGESERVE, 1, "smollm2", 500.0),
        switch(EDGESERVE, 1, "gemma", 1100.0),
        switch(LLAMA_SERVER, 0, "gemma", 5.0),
    ]
    got = several_models.summarize(runs, cold, EDGESERVE)
    assert got["alternating_tps"] == 50.0
    assert got["alternating_tps_rounds"] == [40.0, 60.0]  # by round
    assert got["alternating_itl_p99_ms"] == 40.0
    assert got["alternating_stream_tps_by_model"] == {"gemma": 25.0, "smollm2": 75.0}
    assert got["cold_ttft_p50_ms"] == 700.0
    assert got["cold_ttft_ms_rounds"] == [900.0, 300.0, 500.0, 1100.0]
    assert got["cold_ttft_p50_ms_by_model"] == {"gemma": 1000.0, "smollm2": 400.0}
    assert got["short"] == 1
    assert got["errors"] == ["HTTP 500: x"]
    failed = several_models.summarize([], [switch(EDGESERVE, 0, "gemma", None, "HTTP 503: x")],
                                      EDGESERVE)  # fmt: skip
    assert (failed["cold_ttft_p50_ms"], failed["short"]) == (None, 1)
    assert failed["errors"] == ["gemma: HTTP 503: x"]
    nothing = several_models.summarize([], [], LLAMA_SERVER)
    assert (nothing["alternating_tps"], nothing["cold_ttft_p50_ms"], nothing["short"]) == (
        None,
        None,
        None,
    )


def test_the_budget_case_s_figures():
    ok = Stream(ttft=0.8, tokens=8, short=False)
    cut = Stream(ttft=0.4, tokens=3, short=True)
    failed = Stream(error="HTTP 503: no room", short=True)
    done = [
        ("gemma", ok, 400 * MIB),
        ("smollm2", cut, 300 * MIB),
        ("gemma", failed, 410 * MIB),
        ("smollm2", ok, 310 * MIB),
    ]
    estimated = {"gemma": 400 * MIB, "smollm2": 240 * MIB}
    got = several_models.budget_figures(done, 520 * MIB, estimated, 90 * MIB, 560 * MIB)
    assert got == {
        "budget": 520 * MIB,
        "bound": 572 * MIB,
        "estimated": estimated,
        "requests": 4,
        "errors": 2,
        "error_samples": ["gemma: HTTP 503: no room"],
        "ttft_p50_ms": pytest.approx(800.0),
        "rss_start": 90 * MIB,
        "rss_after": [400 * MIB, 300 * MIB, 410 * MIB, 310 * MIB],
        "rss_peak": 560 * MIB,
        "within": True,
    }
    assert (
        several_models.budget_figures(done, 500 * MIB, estimated, None, 560 * MIB)["within"]
        is False
    )
    assert several_models.budget_figures([], 500 * MIB, estimated, None, None)["within"] is None


def models_figures(cold: float, tps: float, rss_mib: float, spread: float = 0.0) -> dict:
    runs = [recorded("s", 0, tps - spread), recorded("s", 1, tps + spread)]
    switches = [switch("s", 0, "gemma", cold + 200.0), switch("s", 0, "smollm2", cold - 200.0)]
    figures = several_models.summarize(runs, switches, "s")
    return figures | {
        "rss_both": rss_mib * MIB,
        "processes": 1,
        "statuses": {"gemma": "loaded", "smollm2": "loaded"},
        "estimated": {},
    }


def budget(errors: int = 0, peak_mib: float = 480.0) -> dict:
    done = [
        (
            "gemma",
            Stream(
                ttft=0.9, tokens=8, short=i < errors, error="HTTP 503: x" if i < errors else None
            ),
            (400 + i) * MIB,
        )
        for i in range(50)
    ]
    estimated = {"gemma": 400 * MIB, "smollm2": 240 * MIB}
    return several_models.budget_figures(done, 520 * MIB, estimated, 95 * MIB, peak_mib * MIB)


def with_models(data: dict, baseline: dict | None) -> dict:
    data["models"] = {
        "models": {
            "gemma": {"path": str(GEMMA), "mib": 241.0, "chat_format": "gemma"},
            "smollm2": {"path": str(SMOL), "mib": 94.0, "chat_format": None},
        },
        "parallel": 1,
        "max_tokens": 32,
        "requests": 1,
        "prompt_words": 64,
        "rounds": 2,
        "switch_tokens": 8,
        "switch_words": 16,
        "unsupported": {} if baseline else {EDGESERVE_BASELINE: "no --models-dir"},
        "runs": [],
        "cold": [],
        EDGESERVE: models_figures(600.0, 50.0, 420.0, spread=5.0) | {"budget": budget()},
        LLAMA_SERVER: models_figures(800.0, 40.0, 480.0)
        | {
            "processes": 3,
            "statuses": {"gemma": "loaded", "smollm2": "unloaded"},
        },
    }
    if baseline:
        data["models"][EDGESERVE_BASELINE] = baseline
    return data


TITLE = "several models (gemma 241 MiB + smollm2 94 MiB in one --models-dir"


def test_report_beside_llama_server_and_n_a_for_an_old_baseline():
    data = with_models(results(), None)
    lines = lines_of(data)
    # edgeserve, baseline, llama-server, es/llama-server, vs previous
    assert row(lines, TITLE, "cold-switch TTFT p50 ms") == ["600", "n/a", "800", "0.75", "n/a"]
    assert row(lines, TITLE, "cold TTFT ms gemma") == ["800", "n/a", "1000", "0.80", "n/a"]
    assert row(lines, TITLE, "cold TTFT ms smollm2") == ["400", "n/a", "600", "0.67", "n/a"]
    assert row(lines, TITLE, "alternating tok/s") == ["50.0", "n/a", "40.0", "1.25", "n/a"]
    assert row(lines, TITLE, "stream tok/s smollm2") == ["75.0", "n/a", "60.0", "1.25", "n/a"]
    assert row(lines, TITLE, "RSS both loaded MiB") == ["420", "n/a", "480", "0.88", "n/a"]
    assert row(lines, TITLE, "processes") == ["1", "n/a", "3", "0.33", "n/a"]
    assert row(lines, TITLE, "streams cut short") == ["0", "n/a", "0", "-", "n/a"]
    mo = block(lines, TITLE)
    assert (
        "  llama-server: not every model loaded when its RSS was read (gemma loaded, "
        "smollm2 unloaded)"
    ) in mo
    assert (
        "  edgeserve within a one-model budget (--models-memory 520 MiB; estimated gemma ~400, "
        "smollm2 ~240 MiB): 50 requests one at a time, the models alternating: 0 failed or cut "
        "short; peak RSS 480 MiB (bound: budget + 10% = 572 MiB; 95 MiB before the first "
        "request; after the answers: first 400, largest 449, last 449 MiB), TTFT p50 900 ms"
    ) in mo
    assert "  edgeserve-baseline n/a: no --models-dir" in mo
    labels = {f.label for f in report.versus_previous(data)}
    assert not any(label.startswith("models ") for label in labels)


def test_report_vs_previous_where_the_baseline_has_a_catalogue():
    theirs = models_figures(600.0, 50.0, 420.0) | {"budget": budget(peak_mib=400.0)}
    data = with_models(results(), theirs)
    lines = lines_of(data)
    assert row(lines, TITLE, "alternating tok/s") == ["50.0", "50.0", "40.0", "1.25", "1.00"]
    assert row(lines, TITLE, "RSS both loaded MiB") == ["420", "420", "480", "0.88", "1.00"]
    figures = {f.label: f for f in report.versus_previous(data)}
    assert figures["models alternating tok/s"].noise == pytest.approx(10.0 / 50.0)  # 45 and 55
    assert figures["models cold-switch TTFT p50 ms"].noise == pytest.approx(400.0 / 600.0)
    assert figures["models streams cut short"].noise == 0.0
    assert figures["models budget peak RSS MiB"].regressed()  # 480 against 400
    assert not figures["models budget requests failed"].regressed()
    assert "vs previous 1.20" in next(line for line in lines if "one-model budget" in line)


def test_no_models_block_or_targets_without_the_workload():
    assert not any(line.startswith("several models") for line in lines_of(results()))
    assert not any(what.startswith("models:") for what, _, _ in report.targets(results()))


def test_the_models_targets():
    data = with_models(results(), None)
    checks = {what: (ok, why) for what, ok, why in report.targets(data)}
    assert checks["models: cold-switch TTFT p50 <= llama-server's"] == (
        True,
        "600 vs 800 ms (ratio 0.75)",
    )
    assert checks["models: alternating tok/s, both loaded >= llama-server's"][0] is True
    assert checks["models: RSS both loaded <= llama-server's router + children"] == (
        True,
        "420 vs 480 MiB (ratio 0.88)",
    )
    within = "models: alternating requests within a one-model budget"
    assert checks[f"{within}: 0 failed"] == (True, "0 of 50 failed or cut short")
    assert checks[f"{within}: peak RSS <= budget + 10%"] == (True, "480 vs 520 MiB (ratio 0.92)")
    data["models"][EDGESERVE]["budget"] = budget(errors=1, peak_mib=580.0)
    assert any(line.endswith("; first error: gemma: HTTP 503: x") for line in lines_of(data))
    data["models"][EDGESERVE]["cold_ttft_p50_ms"] = 900.0
    data["models"][EDGESERVE]["rss_both"] = 500 * MIB
    checks = {what: (ok, why) for what, ok, why in report.targets(data)}
    assert checks["models: cold-switch TTFT p50 <= llama-server's"][0] is False
    assert checks["models: RSS both loaded <= llama-server's router + children"][0] is False
    assert checks[f"{within}: 0 failed"] == (False, "1 of 50 failed or cut short")
    assert checks[f"{within}: peak RSS <= budget + 10%"][0] is False  # 580 > 572
    data["models"][EDGESERVE]["budget"] = budget(errors=50, peak_mib=90.0)
    checks = {what: (ok, why) for what, ok, why in report.targets(data)}
    assert checks[f"{within}: peak RSS <= budget + 10%"] == (
        None,
        "not measured: every request failed",
    )
    data["models"][EDGESERVE]["budget"] = {"error": "did not start: boom"}
    del data["models"][LLAMA_SERVER]
    checks = {what: (ok, why) for what, ok, why in report.targets(data)}
    assert checks[f"{within}: 0 failed"] == (None, "did not start: boom")
    assert checks["models: RSS both loaded <= llama-server's router + children"][0] is None
    assert "  edgeserve within a one-model budget: not measured: did not start: boom" in block(
        lines_of(data), TITLE
    )


@pytest.fixture
def model(tmp_path: Path) -> Path:
    return vocab_gguf(tmp_path / "gemma.gguf", ("<pad>", "<eos>", "<end_of_turn>"), eos=1,
                      arch="gemma3", template=None)  # fmt: skip


def test_the_workload_runs_by_default_and_has_its_switches(model: Path, capsys):
    args = parse_args(["--model", str(model)])
    assert (args.no_models, args.models_only, args.models_budget_requests) == (False, False, 50)
    assert parse_args(["--model", str(model), "--quick"]).models_budget_requests == 20
    assert parse_args(["--model", str(model), "--no-models"]).no_models
    for bad, said in (
        (["--models-only", "--no-models"], "exclude each other"),
        (["--models-only", "--lora-only"], "exclude each other"),
        (["--models-only", "--model2-only"], "exclude each other"),
        (["--models-only", "--model2", "none"], "--models-only needs a second model"),
    ):
        with pytest.raises(SystemExit):
            parse_args(["--model", str(model), *bad])
        assert said in capsys.readouterr().err


def test_alone_the_workload_runs_no_speed_model(model: Path, tmp_path: Path):
    smol = vocab_gguf(tmp_path / "smol.gguf")
    alone = Bench(
        parse_args(["--model", str(model), "--out", str(tmp_path), "--models-only"]), smol
    )
    assert (alone.only, alone.levels, alone.speed_models, alone.model2) == ("models", [], [], smol)
    assert "model2" not in alone.results
    full = Bench(parse_args(["--model", str(model), "--out", str(tmp_path)]), smol)
    assert full.only is None and len(full.speed_models) == 2


async def test_alternating_runs_a_stream_per_model_each_with_its_own_ban(aiohttp_server):
    seen: list[dict] = []
    server = await aiohttp_server(streaming_chat_app(seen.append))
    url = str(server.make_url("")).rstrip("/")
    models = {"gemma": (1, 106), "smollm2": (0, 2)}
    got = await several_models.alternating(url, LLAMA_SERVER, models, 1, 2, 4, 8)
    assert sorted(body["model"] for body in seen) == ["gemma", "gemma", "smollm2", "smollm2"]
    for body in seen:
        assert body["logit_bias"] == [[t, False] for t in models[body["model"]]]
    assert len({body["messages"][0]["content"] for body in seen}) == 4
    assert (got["round"], got["requests"], got["tokens"], got["short"]) == (1, 4, 16, 0)
    assert {m: s["tokens"] for m, s in got["per_model"].items()} == {"gemma": 8, "smollm2": 8}
    assert sum(s["tps"] for s in got["per_model"].values()) == pytest.approx(got["aggregate_tps"])


async def test_the_budget_case_s_requests_alternate_one_at_a_time(aiohttp_server):
    seen: list[dict] = []
    server = await aiohttp_server(streaming_chat_app(seen.append))
    url = str(server.make_url("")).rstrip("/")
    reads = iter(range(100, 105))
    done = await several_models.one_at_a_time(
        url, EDGESERVE, {"a": (1,), "b": (2,)}, 5, lambda: next(reads)
    )
    assert [body["model"] for body in seen] == ["a", "b", "a", "b", "a"]
    assert [m for m, _, _ in done] == ["a", "b", "a", "b", "a"]
    assert [rss for _, _, rss in done] == [100, 101, 102, 103, 104]  # read after each answer
    assert all(body["max_tokens"] == several_models.SWITCH_TOKENS for body in seen)
    assert not any(s.short for _, s, _ in done)
    warm: list[dict] = []
    server = await aiohttp_server(streaming_chat_app(warm.append))
    url = str(server.make_url("")).rstrip("/")
    assert await several_models.warm_up(url, EDGESERVE, {"a": (1,), "b": (2,)}) is None
    assert [body["model"] for body in warm] == ["a", "b"]


def fake_router_app(state: dict[str, str], unloads: list[str], stuck: str | None = None):
    """A stand-in for GET /models and POST /models/unload: an unload takes one listing to
    finish (the model shows "unloading" once), except for the `stuck` model, which stays."""

    async def models(request: web.Request) -> web.Response:
        cards = [{"id": m, "status": {"value": v}} for m, v in state.items()]
        for m, v in state.items():
            if v == "unloading" and m != stuck:
                state[m] = "unloaded"
        return web.json_response({"data": cards})

    async def unload(request: web.Request) -> web.Response:
        name = (await request.json())["model"]
        unloads.append(name)
        state[name] = "unloading"
        return web.Response(body=json.dumps({"success": True}), content_type="application/json")

    app = web.Application()
    app.router.add_get("/models", models)
    app.router.add_post("/models/unload", unload)
    return app


async def test_unload_all_unloads_the_loaded_models_and_waits_for_them(aiohttp_server, tmp_path):
    state = {"gemma": "loaded", "smollm2": "unloaded", "broken": "failed"}
    unloads: list[str] = []
    server = await aiohttp_server(fake_router_app(state, unloads))
    proc = subprocess.Popen(["sleep", "30"])
    try:
        target = Server(LLAMA_SERVER, 1, server.port, proc, tmp_path / "log")
        await several_models.unload_all(target)
        assert unloads == ["gemma"]
        assert state == {"gemma": "unloaded", "smollm2": "unloaded", "broken": "failed"}
        state["smollm2"] = "loaded"
        stuck = await aiohttp_server(fake_router_app(state, unloads, stuck="smollm2"))
        target = Server(LLAMA_SERVER, 1, stuck.port, proc, tmp_path / "log")
        with pytest.raises(RuntimeError, match="unloading"):
            await several_models.unload_all(target, timeout=0.2)
    finally:
        proc.kill()
        proc.wait()
