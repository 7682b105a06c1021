"""The bench's speed workloads on a second model and the long prompts: the options, each
model's own setup, the long-prompt helpers, the per-step overhead, issue 36's targets and the
comparison of the new figures with the previous release (bench/report.py, bench/previous.py)."""

from __future__ import annotations

import contextlib
from pathlib import Path

import pytest

import bench.__main__ as bench_main
from bench import engine_clock, load, long_prompt, lora, report
from bench.__main__ import Bench, parse_args
from bench.anchors import EDGESERVE, EDGESERVE_BASELINE, LLAMA_SERVER
from tests.unit.bench_models import vocab_gguf
from tests.unit.bench_results import long_prompt as long_prompt_result
from tests.unit.bench_results import results, second_model
from tests.unit.fake_chat_server import streaming_chat_app

SMOL = "SmolLM2-135M-Instruct.Q4_1"
THREE = (EDGESERVE, EDGESERVE_BASELINE, LLAMA_SERVER)


def with_model2(**one_stream: float) -> dict:
    """results() plus a second model where each server streams `one_stream` tok/s alone."""
    data = results()
    speeds = {EDGESERVE: 120.0, EDGESERVE_BASELINE: 120.0, LLAMA_SERVER: 125.0}
    data["model2"] = second_model(speeds | {k.replace("_", "-"): v for k, v in one_stream.items()})
    return data


def checks(data: dict) -> dict[str, bool | None]:
    return {what: ok for what, ok, _ in report.targets(data)}


def test_overhead_is_the_time_per_token_beyond_llama_bench_tg():
    assert report.overhead_ms(100.0, 200.0) == pytest.approx(5.0)
    assert report.overhead_ms(200.0, 200.0) == 0.0
    assert report.overhead_ms(None, 200.0) is None
    assert report.overhead_ms(100.0, None) is None


def test_the_overhead_rows_show_each_llama_cpp_server_and_the_ratios():
    data = with_model2(edgeserve=100.0, edgeserve_baseline=125.0)
    lines = report.table(data).splitlines()
    title = f"{SMOL}: per-step overhead at one stream"
    at = next(i for i, line in enumerate(lines) if line.startswith(title))
    # 1000/100 - 1000/200 = 5; 1000/125 - 1000/200 = 3 (baseline, llama-server)
    assert lines[at + 1].split()[2:] == ["5.00", "3.00", "3.00", "1.67", "1.67"]
    assert lines[at + 2].split()[3:] == ["5.00", "3.00", "3.00", "1.67", "1.67"]  # sampled


def test_second_model_targets_are_issue_36_s_ratios_on_the_sampled_load():
    got = checks(with_model2(edgeserve=120.0))  # llama-server 125: 0.96x
    assert got[f"{SMOL}: one stream tok/s >= 0.95 x llama-server (T=0.7)"] is True
    assert got[f"{SMOL}: 8 streams aggregate >= llama-server (T=0.7)"] is False
    assert got[f"{SMOL}: TTFT p50 <= 1.1 x llama-server's (c=8, T=0.7)"] is True
    assert got[f"{SMOL}: inter-token p99 <= llama-server's (c=1, T=0.7)"] is True
    got = checks(with_model2(edgeserve=118.0))  # 0.944x
    assert got[f"{SMOL}: one stream tok/s >= 0.95 x llama-server (T=0.7)"] is False
    data = with_model2(edgeserve=125.0)
    for r in data["model2"]["runs"]:
        if r["server"] == EDGESERVE and r["temperature"] and r["concurrency"] == 8:
            r["ttft_p50_ms"] = 45.0  # 1.125x llama-server's 40 ms, greedy unchanged
    data["model2"]["summary"] = report.summarize(data["model2"])
    assert checks(data)[f"{SMOL}: TTFT p50 <= 1.1 x llama-server's (c=8, T=0.7)"] is False
    assert checks(data)[f"{SMOL}: 8 streams aggregate >= llama-server (T=0.7)"] is True


def test_without_a_sampled_load_the_second_model_is_judged_greedy():
    data = results()
    data["model2"] = second_model({EDGESERVE: 125.0, LLAMA_SERVER: 125.0}, temperature=0.0)
    assert checks(data)[f"{SMOL}: one stream tok/s >= 0.95 x llama-server (greedy)"] is True


def with_engine_ms(data: dict, greedy: float, sampled: float) -> dict:
    """`data` with edgeserve's engine time a step (/metrics) in the second model's runs."""
    part = data["model2"]
    for r in part["runs"]:
        if r["server"] == EDGESERVE:
            r["engine_step_ms"] = sampled if r["temperature"] else greedy
    part["summary"] = report.summarize(part)
    return data


def test_the_engine_time_target_is_half_a_millisecond_a_step_on_the_sampled_load():
    target = f"{SMOL}: engine time outside llama_decode <= 0.5 ms a step at one stream"
    # tg 200 tok/s is 5 ms a token: 1000/196 - 5 = 0.10 ms; llama-server 1000/125 - 5 = 3.00
    data = with_engine_ms(with_model2(edgeserve=196.0), greedy=0.9, sampled=0.45)
    ok = {what: (met, why) for what, met, why in report.targets(data)}
    assert ok[target] == (
        True,
        "0.45 ms (T=0.7, /metrics); beyond llama-bench's tg: 0.10 ms a token, llama-server 3.00",
    )
    data = with_engine_ms(with_model2(edgeserve=196.0), greedy=0.3, sampled=0.55)
    assert checks(data)[target] is False, "the sampled load's figure, not the greedy one's"
    assert checks(with_model2(edgeserve=196.0))[target] is None  # no /metrics figure


def test_the_engine_time_is_read_from_edgeserve_s_metrics():
    metrics = "\n".join(
        [
            "# TYPE edgeserve_engine_steps_total counter",
            "edgeserve_engine_steps_total 200.0",
            'edgeserve_engine_phase_seconds_total{phase="intake"} 0.01',
            'edgeserve_engine_phase_seconds_total{phase="decode"} 2.0',
            'edgeserve_engine_phase_seconds_total{phase="sample"} 0.05',
            'edgeserve_engine_phase_seconds_total{model="b",phase="sample"} 0.05',
            'edgeserve_engine_phase_seconds_total_created{phase="sample"} 1.7e9',
            "edgeserve_engine_steps_totals 5.0",
        ]
    )
    before = engine_clock.read_engine_clock(metrics)
    assert before == {"steps": 200.0, "intake": 0.01, "decode": 2.0, "sample": 0.1}
    after = {"steps": 300.0, "intake": 0.02, "decode": 3.0, "sample": 0.13}
    got = engine_clock.per_step_ms(before, after)
    assert got is not None
    assert got == pytest.approx(
        {"intake": 0.1, "decode": 10.0, "sample": 0.3, "outside_decode": 0.4}
    )
    assert engine_clock.per_step_ms(before, before) is None


def test_long_prompts_are_held_to_llama_server_s_ttft_on_both_models():
    data = with_model2()
    data["long_prompt"] = long_prompt_result(
        {
            EDGESERVE: (310.0, 1100.0),
            EDGESERVE_BASELINE: (300.0, 1100.0),
            LLAMA_SERVER: (300.0, 1200.0),
        }
    )
    got = checks(data)
    assert got["long-prompt TTFT p50 <= llama-server's (~2000 tokens)"] is False
    assert got["long-prompt TTFT p50 <= llama-server's (~6000 tokens)"] is True
    assert got[f"{SMOL}: long-prompt TTFT p50 <= llama-server's (~6000 tokens)"] is True
    lines = report.table(data).splitlines()
    at = lines.index(
        "long prompts (new text each round, --parallel 1, --ctx-size 8192, 4 tokens generated; "
        "median of 2 rounds)"
    )
    # edgeserve, baseline, llama-server, es/llama-server, vs previous
    assert lines[at + 1].split()[5:] == ["310", "300", "300", "1.03", "1.03"]


def test_long_prompts_are_reported_without_a_previous_release():
    # BASELINE=none: the long prompts ran on edgeserve and llama-server only
    data = results((EDGESERVE, LLAMA_SERVER))
    data["long_prompt"] = long_prompt_result(
        {EDGESERVE: (330.0, 1100.0), LLAMA_SERVER: (300.0, 1000.0)}
    )
    lines = report.table(data).splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("long prompts ("))
    # edgeserve, llama-server, es/llama-server
    assert lines[at + 1].split()[5:] == ["330", "300", "1.10"]
    assert report.versus_previous(data) == []


def test_the_new_figures_are_compared_with_the_previous_release():
    data = with_model2(edgeserve=100.0, edgeserve_baseline=125.0)
    figures = {f.label: f for f in report.versus_previous(data)}
    for label in (
        f"{SMOL} c=1 per-stream tok/s p50",
        f"{SMOL} c=8 sampled TTFT p50 ms",
        f"{SMOL} c=8 inter-token p99 ms",
        f"{SMOL} long prompt TTFT p50 ms ~6000 tokens",
        f"{SMOL} long prompt cut short ~2000",
        "c=4 sampled TTFT p50 ms",
    ):
        assert label in figures
    overhead = figures[f"{SMOL} c=1 overhead ms/token"]
    assert (overhead.ours, overhead.base) == pytest.approx((5.0, 3.0))
    assert overhead.regressed()
    regressions = report.table(data).split("Regressions vs previous")[1]
    assert f"{SMOL} c=1 overhead ms/token: 5.00 vs 3.00" in regressions
    assert f"{SMOL} c=8 sampled aggregate tok/s" in regressions


def test_an_overhead_worse_by_less_than_its_floor_is_no_regression():
    # baseline 1000/195 - 5 = 0.128 ms, edgeserve 1000/193 - 5 = 0.181 ms: 41% worse, 0.05 ms
    data = with_model2(edgeserve=193.0, edgeserve_baseline=195.0)
    figures = {f.label: f for f in report.versus_previous(data)}
    assert not figures[f"{SMOL} c=1 overhead ms/token"].regressed()


def test_a_slower_long_prompt_regresses_beyond_the_rounds_spread():
    data = with_model2()
    part = data["model2"]["long_prompt"]
    part[EDGESERVE]["6000"] |= {"ttft_ms": [1300.0, 1340.0], "ttft_p50_ms": 1320.0}
    figures = {f.label: f for f in report.versus_previous(data)}
    slower = figures[f"{SMOL} long prompt TTFT p50 ms ~6000 tokens"]
    assert slower.noise == pytest.approx(40.0 / 1320.0)
    assert slower.regressed()
    assert not figures[f"{SMOL} long prompt TTFT p50 ms ~2000 tokens"].regressed()


def test_with_the_second_model_alone_the_default_model_s_speed_targets_are_not_listed():
    data = with_model2()
    data["config"]["concurrency"] = []
    data["runs"], data["memory"], data["summary"] = [], {}, {}
    got = checks(data)
    assert "one stream tok/s >= llama-server" not in got
    assert got[f"{SMOL}: one stream tok/s >= 0.95 x llama-server (T=0.7)"] is True
    titles = [line for line in report.table(data).splitlines() if "concurrency 1 (" in line]
    assert titles == [f"{SMOL}: concurrency 1 (--parallel 1, 1 requests per round)"]


@pytest.fixture
def model(tmp_path: Path) -> Path:
    return vocab_gguf(tmp_path / "gemma.gguf", ("<pad>", "<eos>", "<end_of_turn>"), eos=1,
                      arch="gemma3", template=None)  # fmt: skip


def test_the_second_model_options(model: Path, tmp_path: Path, capsys: pytest.CaptureFixture):
    args = parse_args(["--model", str(model)])
    assert (args.model2, args.model2_only, args.long_prompt_tokens) == (
        "smollm2",
        False,
        [2000, 6000],
    )
    assert parse_args(
        ["--model", str(model), "--long-prompt-tokens", "1000"]
    ).long_prompt_tokens == [1000]
    for bad in (
        ["--model2-only", "--model2", "none"],
        ["--model2", str(tmp_path / "missing.gguf")],
        ["--long-prompt-only", "--no-long-prompt"],
        ["--model2-only", "--lora-only"],
        ["--long-prompt-only", "--images-only"],
        ["--long-prompt-tokens", "9000"],
    ):
        with pytest.raises(SystemExit):
            parse_args(["--model", str(model), *bad])
        capsys.readouterr()
    both = parse_args(["--model", str(model), "--model2-only", "--long-prompt-only"])
    assert both.model2_only and both.long_prompt_only


def test_each_speed_model_gets_its_own_eog_ids_and_template(model: Path, tmp_path: Path):
    smol = vocab_gguf(tmp_path / "smol.gguf")
    bench = Bench(parse_args(["--model", str(model), "--out", str(tmp_path)]), smol)
    first, second = bench.speed_models
    assert (first.info.eog_ids, first.setup.chat_format, first.out) == (
        (1, 2),
        "gemma",
        bench.results,
    )
    assert (second.info.eog_ids, second.setup.chat_format) == ((0, 2, 4), None)
    assert second.setup.model == smol and second.out is bench.results["model2"]
    assert bench.results["model2"]["config"]["eog_ids"] == [0, 2, 4]
    alone = Bench(
        parse_args(["--model", str(model), "--out", str(tmp_path), "--model2-only"]), smol
    )
    assert [m.info.name for m in alone.speed_models] == ["smol"]
    assert alone.results["config"]["concurrency"] == []
    assert alone.results["model2"]["config"]["concurrency"] == [1, 4, 8]


def test_long_prompt_sizes_words_and_prompts():
    assert long_prompt.parse_sizes("2000,6000") == [2000, 6000]
    for bad in ("", "0", "8150", "2000,-1"):
        with pytest.raises(ValueError):
            long_prompt.parse_sizes(bad)
    assert long_prompt.words_for(6000, 1.5) == 4000
    indices = [long_prompt.prompt_index(rnd, which) for rnd in range(10) for which in range(3)]
    assert len(set(indices)) == len(indices)
    others = {load.load_prompt_index(r, c, q, w, s) for r in range(10) for c in (1, 8)
              for q in range(4) for w in range(c) for s in (False, True)}  # fmt: skip
    others |= {lora.prompt_index(r, m, q, w) for r in range(10) for m in lora.MODES
               for q in range(4) for w in range(lora.PARALLEL)}  # fmt: skip
    assert not set(indices) & others


async def test_a_long_prompt_bans_the_model_s_eog_ids_and_asks_for_few_tokens(aiohttp_server):
    seen: list[dict] = []
    server = await aiohttp_server(streaming_chat_app(seen.append))
    url = str(server.make_url("")).rstrip("/")
    per_word = await long_prompt.calibrate(url, LLAMA_SERVER, (0, 2))
    assert per_word == 9 / long_prompt.CALIBRATION_WORDS  # the fake counts 9 prompt tokens
    got = await long_prompt.first_token(url, LLAMA_SERVER, 7, 50, (0, 2))
    assert seen[1]["logit_bias"] == [[0, False], [2, False]]
    assert seen[1]["max_tokens"] == long_prompt.GEN_TOKENS
    assert len(seen[1]["messages"][0]["content"].split()) > 50
    summary = long_prompt.summarize({2000: [got, got]})
    assert summary["2000"]["ttft_ms"] == [got.ttft * 1000.0] * 2
    assert (summary["2000"]["prompt_tokens"], summary["2000"]["short"]) == (9, 0)


def test_the_overhead_s_noise_is_its_rounds_spread_and_sampled_runs_have_their_own_row():
    data = with_model2()
    for r in data["model2"]["runs"]:
        if r["server"] == EDGESERVE and r["concurrency"] == 1:
            if r["temperature"]:
                r["stream_tps_p50"] = 100.0  # sampled: 1000/100 - 1000/200 = 5 ms
            else:
                r["stream_tps_p50"] = 180.0 if r["round"] == 0 else 190.0
    data["model2"]["summary"] = report.summarize(data["model2"])
    figures = {f.label: f for f in report.versus_previous(data)}
    greedy = figures[f"{SMOL} c=1 overhead ms/token"]
    rounds = [1000 / 180 - 5, 1000 / 190 - 5]  # 0.556 and 0.263 ms: a spread of 72%
    assert greedy.ours == pytest.approx(1000 / 185 - 5)  # from the median tok/s
    assert greedy.noise == pytest.approx((rounds[0] - rounds[1]) / (sum(rounds) / 2))
    assert figures[f"{SMOL} c=1 sampled overhead ms/token"].ours == pytest.approx(5.0)


async def test_speed_only_runs_the_levels_and_long_prompts_on_both_models_and_nothing_else(
    model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """make gpu-check's bench: --speed-only (the workload methods recorded, no server started)."""
    smol = vocab_gguf(tmp_path / "smol.gguf")
    args = parse_args(["--model", str(model), "--out", str(tmp_path), "--speed-only"])
    bench = Bench(args, smol)
    called: list[str] = []
    monkeypatch.setattr(bench_main, "Servers", lambda setup: contextlib.nullcontext())
    for name in ("level", "long_prompt", "long_context", "embeddings", "grounded", "images",
                 "lora", "documents", "several_models"):  # fmt: skip

        async def record(*_args, name=name, **_kwargs) -> None:
            called.append(name)

        monkeypatch.setattr(bench, name, record)
    monkeypatch.setattr(bench_main.report, "summarize", lambda results: {})
    await bench.run()
    assert called == ["level"] * 3 + ["long_prompt"] + ["level"] * 3 + ["long_prompt"]
    with pytest.raises(SystemExit):
        parse_args(["--model", str(model), "--speed-only", "--documents-only"])
