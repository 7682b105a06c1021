"""The bench's LoRA workload (bench/lora.py): the flag probe, the servers' arguments, the
request bodies, the streams' sets and prompts, the turns, the figures from recorded runs, the
memory figures, its report lines ("n/a" for a baseline without --lora), its targets and
switches, and one load against two fake streaming servers."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from bench import lora, report
from bench.__main__ import parse_args
from bench.anchors import EDGESERVE, EDGESERVE_BASELINE, LLAMA_SERVER
from bench.load import Stream
from tests.unit.bench_results import MIB, results
from tests.unit.fake_chat_server import streaming_chat_app
from tests.unit.test_bench_report import block, lines_of, row


@pytest.mark.parametrize(
    ("help_text", "offered"),
    [
        ("  --lora NAME=PATH    a LoRA adapter GGUF for the model (repeatable)", True),
        ("--lora FNAME                            path to LoRA adapter", True),
        ("--lora-scaled FNAME:SCALE,...\n--lora-init-without-apply", False),
        ("  --allow-runtime-lora  load and unload adapters over HTTP", False),
        ("  --model PATH\n  --mmproj PATH", False),
        ("", False),
    ],
)
def test_a_server_takes_adapters_when_its_help_lists_lora(help_text: str, offered: bool):
    assert lora.offers_lora(help_text) is offered


def test_each_server_loads_both_adapters_in_the_same_order():
    paths = [Path("/r/tiny-lora-a.gguf"), Path("/r/tiny-lora-b.gguf")]
    assert lora.server_args(EDGESERVE, paths) == (
        "--lora",
        "a=/r/tiny-lora-a.gguf",
        "--lora",
        "b=/r/tiny-lora-b.gguf",
    )
    assert lora.server_args(EDGESERVE_BASELINE, paths) == lora.server_args(EDGESERVE, paths)
    assert lora.server_args(LLAMA_SERVER, paths) == (
        "--lora",
        "/r/tiny-lora-a.gguf",
        "--lora",
        "/r/tiny-lora-b.gguf",
        "--lora-init-without-apply",
    )
    with pytest.raises(ValueError, match="does not take adapters"):
        lora.server_args("llama_cpp.server", paths)


def test_the_lora_field_of_each_set():
    # the base says every scale 0: llama-server runs a request without the field under its
    # start-up list, where --lora put every adapter at scale 1
    assert lora.lora_field("base") == [{"id": 0, "scale": 0.0}, {"id": 1, "scale": 0.0}]
    assert lora.lora_field("a") == [{"id": 0, "scale": 1.0}]
    assert lora.lora_field("b") == [{"id": 1, "scale": 1.0}]


def test_both_servers_get_the_same_greedy_streamed_request():
    ours = lora.body(EDGESERVE, "b", "Tell a story.", 32, (1, 106))
    theirs = lora.body(LLAMA_SERVER, "b", "Tell a story.", 32, (1, 106))
    assert ours["lora"] == theirs["lora"] == [{"id": 1, "scale": 1.0}]
    assert ours["messages"] == [{"role": "user", "content": "Tell a story."}]
    assert (ours["max_tokens"], ours["temperature"], ours["stream"]) == (32, 0.0, True)
    # only the end-of-generation ban differs: each server's own form of it
    assert {k: v for k, v in ours.items() if k != "logit_bias"} == {
        k: v for k, v in theirs.items() if k != "logit_bias"
    }


def test_mixed_puts_two_streams_on_each_set_and_base_only_all_on_the_base():
    mixed = [lora.stream_set(lora.MIXED, w) for w in range(lora.PARALLEL)]
    assert mixed == ["base", "a", "b", "base", "a", "b"]
    assert {lora.stream_set(lora.BASE_ONLY, w) for w in range(lora.PARALLEL)} == {"base"}


def test_every_request_of_a_workload_has_its_own_prompt():
    indices = [
        lora.prompt_index(rnd, mode, r, w)
        for rnd in range(5)
        for mode in lora.MODES
        for r in range(4)
        for w in range(lora.PARALLEL)
    ]
    assert len(set(indices)) == len(indices)
    # apart from the load levels' prompts (100_000 * (round + 1) + ..., under 10 rounds)
    assert min(indices) >= 10_000_000


def test_servers_rotate_each_round_and_take_both_loads_back_to_back():
    servers = ["es", "ls"]
    assert lora.turns(servers, 0) == [
        ("es", "mixed"),
        ("es", "base-only"),
        ("ls", "mixed"),
        ("ls", "base-only"),
    ]
    assert lora.turns(servers, 1) == [
        ("ls", "base-only"),
        ("ls", "mixed"),
        ("es", "base-only"),
        ("es", "mixed"),
    ]
    assert lora.turns(servers, 2) == lora.turns(servers, 0)
    assert lora.turns(["es"], 1) == [("es", "base-only"), ("es", "mixed")]
    assert lora.turns([], 0) == []


def stream(tokens: int, gaps: list[float], tps: float | None = 10.0, **more: Any) -> Stream:
    return Stream(tokens=tokens, gaps=gaps, decode_tps=tps, short=False, **more)


def test_a_sets_share_of_a_run():
    streams = [stream(32, [0.02, 0.5], 30.0, ttft=0.2), stream(32, [0.03], 10.0, ttft=1.0)]
    got = lora.set_figures(streams, 4.0)
    assert got == {
        "streams": 2,
        "tokens": 64,
        "tps": 16.0,
        "stream_tps_p50": 20.0,
        "ttft_p50_ms": pytest.approx(600.0),
        "itl_max_ms": pytest.approx(500.0),
    }
    empty = lora.set_figures([stream(0, [], None)], 0.0)
    assert (empty["tps"], empty["stream_tps_p50"], empty["ttft_p50_ms"], empty["itl_max_ms"]) == (
        0.0,
        None,
        None,
        None,
    )


def recorded(
    server: str, mode: str, rnd: int, tps: float, itl: float = 20.0, **more: Any
) -> dict[str, Any]:
    """One recorded LoRA run (the shape `lora.run` returns), its sets sharing `tps`."""
    sets = lora.SETS if mode == lora.MIXED else ("base",)
    return {
        "server": server,
        "concurrency": 6,
        "requests": 6,
        "aggregate_tps": tps,
        "stream_tps_p50": tps / 6,
        "ttft_p50_ms": 300.0,
        "itl_p50_ms": itl,
        "itl_p99_ms": 3 * itl,
        "itl_max_ms": 5 * itl,
        "short": 0,
        "errors": [],
        "mode": mode,
        "round": rnd,
        "per_set": {
            s: {
                "streams": 6 // len(sets),
                "tps": tps / len(sets),
                "ttft_p50_ms": 100.0 * (1 + i),
                "itl_max_ms": 5 * itl,
            }
            for i, s in enumerate(sets)
        },
    } | more


def test_summarize_from_recorded_runs():
    runs = [
        recorded(EDGESERVE, lora.MIXED, 0, 60.0, itl=60.0),
        recorded(EDGESERVE, lora.BASE_ONLY, 0, 100.0),
        recorded(EDGESERVE, lora.MIXED, 1, 45.0, itl=70.0, short=1, errors=["HTTP 500: x"]),
        recorded(EDGESERVE, lora.BASE_ONLY, 1, 90.0),
        recorded(LLAMA_SERVER, lora.MIXED, 0, 10.0),
    ]
    got = lora.summarize(runs, EDGESERVE)
    assert got["mixed_tps"] == pytest.approx(52.5)
    assert got["mixed_tps_rounds"] == [60.0, 45.0]
    assert got["base_tps"] == pytest.approx(95.0)
    # per round (0.6 and 0.5), then the median: not the medians' ratio (52.5 / 95)
    assert got["mixed_over_base_rounds"] == pytest.approx([0.6, 0.5])
    assert got["mixed_over_base"] == pytest.approx(0.55)
    assert got["mixed_itl_p50_ms"] == pytest.approx(65.0)
    assert got["mixed_itl_p99_ms"] == pytest.approx(195.0)
    assert got["base_itl_p99_ms"] == pytest.approx(60.0)
    assert got["mixed_itl_max_ms"] == pytest.approx(325.0)
    assert got["mixed_ttft_p50_ms"] == 300.0
    assert got["short"] == 1
    assert got["errors"] == ["HTTP 500: x"]
    assert set(got["mixed_per_set"]) == {"base", "a", "b"}
    assert got["mixed_per_set"]["a"]["tps"] == pytest.approx(17.5)
    assert got["mixed_per_set"]["a"]["itl_max_ms"] == pytest.approx(350.0)  # the longest
    assert got["mixed_per_set"]["b"]["ttft_p50_ms"] == pytest.approx(300.0)


def test_summarize_a_server_without_runs_or_a_load():
    got = lora.summarize([recorded(EDGESERVE, lora.MIXED, 0, 60.0)], EDGESERVE)
    assert got["mixed_tps"] == 60.0
    assert got["base_tps"] is None
    assert got["mixed_over_base"] is None
    nothing = lora.summarize([], LLAMA_SERVER)
    assert (nothing["mixed_tps"], nothing["short"], nothing["mixed_per_set"]) == (None, None, {})


def test_memory_of_one_process_against_three():
    one = {"rss": 474 * MIB, "rss_anon": 200 * MIB, "pss": 460 * MIB}
    three = {
        "base": {"rss": 465 * MIB, "rss_anon": 195 * MIB, "pss": 285 * MIB},
        "base + a": {"rss": 470 * MIB, "rss_anon": 198 * MIB, "pss": 288 * MIB},
        "base + b": {"rss": 470 * MIB, "rss_anon": 198 * MIB, "pss": 288 * MIB},
    }
    got = lora.memory_figures(one, three)
    assert got["three_total"] == {"rss": 1405 * MIB, "rss_anon": 591 * MIB, "pss": 861 * MIB}
    assert got["one_over_three"]["rss"] == pytest.approx(474 / 1405)
    assert got["one_over_three"]["pss"] == pytest.approx(460 / 861)
    three["base"]["pss"] = None  # a process without smaps_rollup
    got = lora.memory_figures(one, three)
    assert got["three_total"]["pss"] is None
    assert got["one_over_three"]["pss"] is None
    assert got["one_over_three"]["rss"] == pytest.approx(474 / 1405)


def test_a_live_process_memory():
    got = lora.process_memory(os.getpid())
    assert got["rss"] and got["rss"] > MIB
    assert got["rss_anon"] and got["rss_anon"] <= got["rss"]
    assert got["pss"] is None or 0 < got["pss"] <= got["rss"]
    assert lora.process_memory(2**22 + 12345) == {"rss": None, "rss_anon": None, "pss": None}


def test_the_warm_up_answers_check():
    warm = {
        EDGESERVE: {"base": "The sea", "a": "I am", "b": "The sea"},
        LLAMA_SERVER: {"base": "The sea", "a": "I am", "b": "Purple"},
    }
    assert lora.answers_check(warm) == {
        "adapters_changed": {EDGESERVE: 1, LLAMA_SERVER: 2},
        "sets_alike": 2,
        "sets": 3,
    }
    assert lora.answers_check({EDGESERVE: warm[EDGESERVE]})["sets_alike"] is None


def lora_figures(mixed: float, base: float, spread: float = 0.0) -> dict[str, Any]:
    runs = [
        recorded(EDGESERVE, lora.MIXED, 0, mixed - spread),
        recorded(EDGESERVE, lora.MIXED, 1, mixed + spread),
        recorded(EDGESERVE, lora.BASE_ONLY, 0, base),
        recorded(EDGESERVE, lora.BASE_ONLY, 1, base),
    ]
    return lora.summarize(runs, EDGESERVE) | {"rss_loaded": 470 * MIB}


def with_lora(data: dict, baseline: dict | None) -> dict:
    data["lora"] = {
        "parallel": 6,
        "streams": 6,
        "requests": 1,
        "max_tokens": 32,
        "rounds": 2,
        "adapters": ["bench/results/lora/tiny-lora-a.gguf", "bench/results/lora/tiny-lora-b.gguf"],
        "unsupported": {} if baseline else {EDGESERVE_BASELINE: "no --lora"},
        EDGESERVE: lora_figures(60.0, 80.0, spread=6.0),
        LLAMA_SERVER: lora_figures(50.0, 80.0),
        "answers": {
            "adapters_changed": {EDGESERVE: 2, LLAMA_SERVER: 2},
            "sets_alike": 3,
            "sets": 3,
        },
        "memory": lora.memory_figures(
            {"rss": 474 * MIB, "rss_anon": 200 * MIB, "pss": 460 * MIB},
            {
                label: {"rss": 470 * MIB, "rss_anon": 200 * MIB, "pss": 290 * MIB}
                for label in lora.THREE_PROCESSES
            },
        )
        | {"parallel": 6},
    }
    if baseline:
        data["lora"][EDGESERVE_BASELINE] = baseline
    return data


TITLE = "LoRA adapters (base + 2 tiny adapters, --parallel 6"


def test_report_lora_beside_llama_server_and_n_a_for_an_old_baseline():
    data = with_lora(results(), None)
    lines = lines_of(data)
    # edgeserve, baseline, llama-server, es/llama-server, vs previous
    assert row(lines, TITLE, "mixed tok/s") == ["60.0", "n/a", "50.0", "1.20", "n/a"]
    assert row(lines, TITLE, "base-only tok/s") == ["80.0", "n/a", "80.0", "1.00", "n/a"]
    assert row(lines, TITLE, "mixed / base-only") == ["0.75", "n/a", "0.62", "1.20", "n/a"]
    assert row(lines, TITLE, "mixed ITL p99 ms") == ["60.0", "n/a", "60.0", "1.00", "n/a"]
    assert row(lines, TITLE, "streams cut short") == ["0", "n/a", "0", "-", "n/a"]
    assert row(lines, TITLE, "RSS after warm-up MiB") == ["470", "n/a", "470", "1.00", "n/a"]
    lo = block(lines, TITLE)
    assert (
        "  edgeserve mixed, per set (base / a / b): 20.0 / 20.0 / 20.0 tok/s, "
        "TTFT p50 100 / 200 / 300 ms, longest gap 100 / 100 / 100 ms"
    ) in lo
    assert (
        "  warm-up: adapters that change the base's answer: edgeserve 2/2, llama-server 2/2; "
        "the servers answer alike under 3/3 sets"
    ) in lo
    memory = [line for line in lo if "memory" in line or "three processes" in line]
    assert memory[0].endswith("one process with base + a + b: RSS 474 MiB (PSS 460, anonymous 200)")
    assert (
        "RSS 1410 MiB (PSS 870, anonymous 600) together; one / three: RSS 0.34, PSS 0.53, "
        "anonymous 0.33"
    ) in memory[1]
    assert "  edgeserve-baseline n/a: no --lora" in lo
    labels = {f.label for f in report.versus_previous(data)}
    assert not any(label.startswith("lora ") for label in labels)
    assert "c=4 aggregate tok/s" in labels  # the rest is compared as before


def test_report_lora_vs_previous_where_the_baseline_serves_adapters():
    data = with_lora(results(), lora_figures(60.0, 60.0) | {"rss_loaded": 470 * MIB})
    lines = lines_of(data)
    assert row(lines, TITLE, "mixed tok/s") == ["60.0", "60.0", "50.0", "1.20", "1.00"]
    assert row(lines, TITLE, "mixed / base-only") == ["0.75", "1.00", "0.62", "1.20", "0.75"]
    figures = {f.label: f for f in report.versus_previous(data)}
    share = figures["lora mixed / base-only"]
    assert share.noise == pytest.approx(0.15 / 0.75)  # edgeserve's rounds: 54/80 and 66/80
    assert share.regressed()
    assert not figures["lora mixed tok/s"].regressed()
    assert figures["lora streams cut short"].noise == 0.0
    assert figures["lora RSS after warm-up MiB"].noise == report.NOISE


def test_report_without_llama_server_or_memory():
    data = with_lora(results((EDGESERVE,)), None)
    data["lora"]["unsupported"] = {}
    del data["lora"][LLAMA_SERVER], data["lora"]["memory"]
    data["lora"]["answers"] = {"adapters_changed": {EDGESERVE: 2}, "sets_alike": None, "sets": 3}
    lines = lines_of(data)
    assert row(lines, TITLE, "mixed tok/s") == ["60.0"]
    lo = block(lines, TITLE)
    assert "  warm-up: adapters that change the base's answer: edgeserve 2/2" in lo
    assert not any("memory" in line for line in lo)
    data["lora"]["memory"] = {"error": "did not start: boom"}
    assert "  memory case not measured: did not start: boom" in block(lines_of(data), TITLE)


def test_no_lora_block_without_the_workload():
    assert not any(line.startswith("LoRA adapters") for line in lines_of(results()))
    whats = {what for what, _, _ in report.targets(results())}
    assert not any("adapters" in what for what in whats)


def test_the_lora_targets():
    data = with_lora(results(), None)
    checks = {what: (ok, why) for what, ok, why in report.targets(data)}
    share = "mixed adapters tok/s >= 0.8x base-only"
    assert checks[share] == (
        False,
        "0.75x (60.0 vs 80.0 tok/s, median of the rounds' ratios)",
    )
    assert checks["mixed adapters tok/s >= llama-server's"] == (
        True,
        "60.0 vs 50.0 (ratio 1.20)",
    )
    data["lora"][EDGESERVE] = lora_figures(70.0, 80.0)
    checks = {what: ok for what, ok, _ in report.targets(data)}
    assert checks[share] is True
    del data["lora"][EDGESERVE], data["lora"][LLAMA_SERVER]
    checks = {what: (ok, why) for what, ok, why in report.targets(data)}
    assert checks[share] == (None, "not measured")
    assert checks["mixed adapters tok/s >= llama-server's"][0] is None


@pytest.fixture
def model(tmp_path: Path) -> Path:
    path = tmp_path / "m.gguf"
    path.write_bytes(b"GGUF")
    return path


def test_lora_runs_by_default_and_has_its_switches(model: Path, capsys):
    args = parse_args(["--model", str(model)])
    assert (args.no_lora, args.lora_only, args.lora_requests) == (False, False, 1)
    assert parse_args(["--model", str(model), "--quick"]).lora_requests == 1
    assert parse_args(["--model", str(model), "--lora-requests", "2"]).lora_requests == 2
    assert parse_args(["--model", str(model), "--no-lora"]).no_lora
    assert parse_args(["--model", str(model), "--lora-only"]).lora_only
    for both in (["--lora-only", "--no-lora"], ["--lora-only", "--images-only"]):
        with pytest.raises(SystemExit):
            parse_args(["--model", str(model), *both])
        assert "exclude each other" in capsys.readouterr().err


async def test_one_load_against_fake_servers_sends_each_stream_under_its_set(aiohttp_server):
    seen: dict[str, list[dict]] = {"a": [], "b": []}

    servers = {name: await aiohttp_server(streaming_chat_app(seen[name].append)) for name in seen}
    got = {
        name: await lora.run(
            str(server.make_url("")).rstrip("/"), EDGESERVE, lora.MIXED, 1, 2, 4, 8, (1,)
        )
        for name, server in servers.items()
    }
    assert len(seen["a"]) == 12  # 6 streams, 2 requests each
    fields = sorted(json.dumps(body["lora"]) for body in seen["a"])
    assert fields == sorted(
        json.dumps(lora.lora_field(lora.stream_set(lora.MIXED, w)))
        for w in range(6)
        for _ in range(2)
    )
    # the same requests for both servers, a new prompt for each
    assert sorted(map(json.dumps, seen["a"])) == sorted(map(json.dumps, seen["b"]))
    assert len({body["messages"][0]["content"] for body in seen["a"]}) == 12
    result = got["a"]
    assert (result["mode"], result["round"], result["requests"], result["short"]) == (
        "mixed",
        1,
        12,
        0,
    )
    assert result["tokens"] == 48
    assert set(result["per_set"]) == {"base", "a", "b"}
    assert all(s["streams"] == 4 and s["tokens"] == 16 for s in result["per_set"].values())
    assert sum(s["tps"] for s in result["per_set"].values()) == pytest.approx(
        result["aggregate_tps"]
    )
    base_only = await lora.run(
        str(servers["a"].make_url("")).rstrip("/"), LLAMA_SERVER, lora.BASE_ONLY, 0, 1, 4, 8, (1,)
    )
    assert set(base_only["per_set"]) == {"base"}
    assert all(body["lora"] == lora.lora_field("base") for body in seen["a"][12:])
