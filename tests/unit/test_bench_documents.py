"""The bench's documents workload (bench/documents.py): how many documents overflow the KV
cache, the prompts of the two passes, the disk tier's flag probe and the servers' arguments,
the figures, the passes' turns and the restart case against fake servers (a baseline without
the flag skipped, never a crash), its report block, its targets and its switches."""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest

from bench import documents, load, long_prompt, report, several_models
from bench.__main__ import Bench, parse_args
from bench.anchors import (
    EDGESERVE,
    EDGESERVE_BASELINE,
    LLAMA_SERVER,
    Server,
    Servers,
    Setup,
    command,
)
from bench.documents import FIRST, SECOND
from bench.load import Stream
from tests.unit.bench_models import vocab_gguf
from tests.unit.bench_results import MIB, bench_setup, results
from tests.unit.fake_chat_server import streaming_chat_app
from tests.unit.test_bench_report import block, lines_of, row


def test_the_fewest_documents_overflow_the_kv_cache():
    fewest = documents.fewest_documents()
    assert fewest * documents.DOC_TOKENS > documents.CTX
    assert (fewest - 1) * documents.DOC_TOKENS <= documents.CTX
    assert [documents.check_count(n) for n in (0, fewest, 6)] == [0, fewest, 6]
    with pytest.raises(ValueError, match=f"at least {fewest}"):
        documents.check_count(fewest - 1)


def test_the_passes_share_each_document_and_ask_another_question():
    first, second = (documents.prompt(0, 50, which) for which in (FIRST, SECOND))
    text = load.prompt_text(documents.INDEX_BASE, 50)
    assert first.startswith(text) and second.startswith(text)
    assert first != second
    assert first.endswith(documents.QUESTIONS[FIRST])
    assert second.endswith(documents.QUESTIONS[SECOND])
    assert documents.prompt(1, 50, FIRST) != first


def test_the_documents_are_apart_from_every_other_workload_s_prompts():
    ours = {documents.INDEX_BASE + doc for doc in range(100)}
    others = {0}  # every warm-up's
    others |= {long_prompt.prompt_index(r, w) for r in range(10) for w in range(4)}
    others |= {several_models.cold_index(r, w) for r in range(10) for w in range(2)}
    others |= {several_models.alternating_index(r, q, w) for r in range(10) for q in range(4)
               for w in range(2)}  # fmt: skip
    others |= {load.load_prompt_index(r, c, q, w, s) for r in range(10) for c in (1, 8)
               for q in range(4) for w in range(c) for s in (False, True)}  # fmt: skip
    assert not ours & others


@pytest.mark.parametrize(
    ("help_text", "offered"),
    [
        ("  --prompt-cache-dir DIR   keep the prompt cache on disk", True),
        ("--prompt-cache-ram BYTES\n--prompt-cache-dir PATH", True),
        ("--prompt-cache-dirs PATH", False),
        ("--prompt-cache-ram BYTES", False),
        ("", False),
    ],
)
def test_a_server_has_a_disk_tier_when_its_help_lists_the_flag(help_text: str, offered: bool):
    assert documents.offers_prompt_cache_dir(help_text) is offered


def fake_binary(path: Path, help_text: str) -> Path:
    path.write_text(f"#!/bin/sh\necho '{help_text}'\n")
    path.chmod(0o755)
    return path


def with_binaries(tmp_path: Path) -> Setup:
    """A setup whose edgeserve offers the disk tier and whose baseline does not."""
    return replace(
        bench_setup(tmp_path),
        edgeserve=fake_binary(tmp_path / "edgeserve", "  --prompt-cache-dir DIR"),
        baseline=fake_binary(tmp_path / "old-edgeserve", "  --model PATH  --ctx-size N"),
    )


NO_DISK_TIER = "no --prompt-cache-dir (a version without the disk tier)"


def test_a_baseline_without_the_disk_tier_is_found_by_its_help(tmp_path: Path):
    setup = with_binaries(tmp_path)
    assert documents.missing_disk_tier(EDGESERVE, setup) is None
    assert documents.missing_disk_tier(EDGESERVE_BASELINE, setup) == NO_DISK_TIER


def test_the_servers_run_in_a_context_of_4096_cells_the_disk_tier_in_a_folder(tmp_path: Path):
    setup = replace(bench_setup(tmp_path), ctx_size=8192)
    ours = command(EDGESERVE, setup, 8000, documents.PARALLEL, documents.server_args(EDGESERVE))
    assert ours[-2:] == ["--ctx-size", "4096"]  # after the setup's: the last one counts
    assert ours[ours.index("--parallel") + 1] == "2"
    theirs = command(LLAMA_SERVER, setup, 8000, 2, documents.server_args(LLAMA_SERVER))
    assert theirs[-2:] == ["-c", "4096"]
    assert "--cache-ram" not in theirs  # its default: 8 GiB of host memory
    disk = documents.server_args(EDGESERVE_BASELINE, tmp_path / "cache")
    assert disk == ("--ctx-size", "4096", "--prompt-cache-dir", str(tmp_path / "cache"))


def streams(*ms: float | None, cached: int = 0, short: int = 0) -> list[Stream]:
    return [
        Stream(ttft=None if v is None else v / 1000.0, tokens=4, prompt_tokens=1500,
               cached_tokens=cached, short=i < short, error="HTTP 500: x" if i < short else None)
        for i, v in enumerate(ms)
    ]  # fmt: skip


def test_a_pass_s_figures_and_a_server_s_totals():
    got = documents.figures(SECOND, streams(300.0, 100.0, 200.0, None, cached=1490, short=1))
    assert got == {
        "second_ttft_ms": pytest.approx([300.0, 100.0, 200.0]),
        "second_ttft_p50_ms": pytest.approx(200.0),
        "second_prompt_tokens": 1500.0,
        "second_cached_tokens": 1490.0,
        "second_short": 1,
        "second_errors": ["HTTP 500: x"],
    }
    found = documents.figures(FIRST, streams(2000.0, short=1)) | got
    found |= documents.figures("restart", streams(500.0))
    totals = documents.with_totals(found)
    assert totals["short"] == 2
    assert totals["restart_over_warm"] == pytest.approx(2.5)
    assert documents.with_totals(got)["restart_over_warm"] is None


def test_the_folder_s_bytes_count_every_file_below_it(tmp_path: Path):
    (tmp_path / "a").write_bytes(b"x" * 10)
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "b").write_bytes(b"x" * 5)
    assert documents.folder_bytes(tmp_path) == 15


@dataclass
class FakeProc:
    """What the workload reads of a server's process: its id (this test's) and exit code."""

    pid: int
    returncode: int | None = None


def fake_server(kind: str, port: int) -> Server:
    """A server of `kind` at `port` whose process is this test's."""
    return Server(kind, 2, port, FakeProc(os.getpid()), Path("log"))  # type: ignore[arg-type]


class FakeServers:
    """A stand-in for the bench's `Servers`: every server it starts is the fake chat server at
    `port`; it records each start's arguments and each stop, and fails the starts in `fail`."""

    def __init__(self, setup: Setup, port: int, fail: tuple[str, ...] = ()) -> None:
        self.setup = setup
        self.port = port
        self.fail = fail
        self.started: list[tuple[str, int, tuple[str, ...], str]] = []
        self.stopped: list[str] = []

    def start(self, kind: str, parallel: int, extra: tuple[str, ...] = (), tag: str = "") -> Server:
        self.started.append((kind, parallel, extra, tag))
        return fake_server(kind, self.port)

    async def wait_ready(self, server: Server) -> None:
        if self.started[-1][3] in self.fail:
            raise RuntimeError(f"{server.kind} exited with 1:\nbad flag")

    def stop(self, server: Server) -> None:
        server.proc.returncode = 0
        self.stopped.append(server.kind)


class Recorder:
    """The bodies the fake chat server got, and the quiet calls' labels."""

    def __init__(self) -> None:
        self.bodies: list[dict[str, Any]] = []
        self.labels: list[str] = []

    async def quiet(self, running: list[Server], label: str, call: Any) -> Stream:
        self.labels.append(label)
        return await call


async def fake_url(aiohttp_server: Any, seen: Recorder) -> int:
    server = await aiohttp_server(streaming_chat_app(seen.bodies.append))
    return int(server.port)


def question(body: dict[str, Any]) -> str:
    return body["messages"][0]["content"].rsplit("\n\n", 1)[1]


async def test_each_pass_asks_every_document_in_order_the_servers_taking_turns(aiohttp_server):
    seen = Recorder()
    port = await fake_url(aiohttp_server, seen)
    work = documents.Workload(FakeServers(bench_setup(Path(".")), port), 3, (1, 106), seen.quiet)
    work.tokens_per_word = {EDGESERVE: 2.0}
    assert work.words == 750
    running = [fake_server(kind, port) for kind in (EDGESERVE, LLAMA_SERVER)]
    first = await work.one_pass(running, FIRST)
    second = await work.one_pass(running, SECOND)
    assert [len(first[k]) for k in (EDGESERVE, LLAMA_SERVER)] == [3, 3]
    assert not any(s.short for s in first[EDGESERVE] + second[LLAMA_SERVER])
    texts = [body["messages"][0]["content"] for body in seen.bodies]
    docs = [documents.prompt(d, 750, FIRST) for d in range(3)]
    # each document goes to both servers (the order rotating), then the next one
    assert texts[:6] == [docs[0], docs[0], docs[1], docs[1], docs[2], docs[2]]
    assert [question(b) for b in seen.bodies] == [documents.QUESTIONS[FIRST]] * 6 + [
        documents.QUESTIONS[SECOND]
    ] * 6
    assert texts[6:] == [documents.prompt(d, 750, SECOND) for d in range(3) for _ in (0, 1)]
    assert seen.labels[:3] == [
        f"documents {EDGESERVE} first #0",
        f"documents {LLAMA_SERVER} first #0",
        f"documents {LLAMA_SERVER} first #1",  # rotated
    ]
    ours, theirs = {"1": -100, "106": -100}, [[1, False], [106, False]]
    assert [b["logit_bias"] for b in seen.bodies[:4]] == [ours, theirs, theirs, ours]
    assert all(b["max_tokens"] == documents.GEN_TOKENS for b in seen.bodies)


async def test_the_run_restarts_edgeserve_on_its_disk_tier_and_skips_an_old_baseline(
    aiohttp_server, tmp_path: Path, capsys
):
    seen = Recorder()
    port = await fake_url(aiohttp_server, seen)
    servers = FakeServers(with_binaries(tmp_path), port)
    work = documents.Workload(servers, 3, (1,), seen.quiet)
    work.tokens_per_word = {EDGESERVE: 75.0}  # 20 words a document
    running = [servers.start(kind, 2, documents.server_args(kind))
               for kind in (EDGESERVE, EDGESERVE_BASELINE, LLAMA_SERVER)]  # fmt: skip
    for server in running:
        assert await work.warm_up(server) is None  # the fake answers 9 prompt tokens
    # each server's first count is kept (the restart's warm-ups leave the documents' size)
    per_word = 9 / long_prompt.CALIBRATION_WORDS
    assert work.tokens_per_word == {EDGESERVE: 75.0, EDGESERVE_BASELINE: per_word,
                                    LLAMA_SERVER: per_word}  # fmt: skip
    assert work.words == 20
    got = await work.run(running)
    assert got["restart_skipped"] == {EDGESERVE_BASELINE: NO_DISK_TIER}
    assert f"{EDGESERVE_BASELINE} after a restart with the disk tier: skipped" in (
        capsys.readouterr().out
    )
    ours = got[EDGESERVE]
    assert ours["stop_exit_code"] == 0 and ours["disk_bytes"] == 0
    assert len(ours["disk_first_ttft_ms"]) == len(ours["restart_ttft_ms"]) == 3
    assert ours["restart_over_warm"] == pytest.approx(
        ours["restart_ttft_p50_ms"] / ours["second_ttft_p50_ms"]
    )
    assert "restart_ttft_p50_ms" not in got[EDGESERVE_BASELINE]
    assert "restart_ttft_p50_ms" not in got[LLAMA_SERVER]
    assert all(got[k]["idle_rss"] > 0 and got[k]["short"] == 0 for k in running_kinds(running))
    disk, restarted = servers.started[3:5]
    folder = disk[2][disk[2].index("--prompt-cache-dir") + 1]
    assert disk == (EDGESERVE, 2, ("--ctx-size", "4096", "--prompt-cache-dir", folder), "disk")
    assert restarted == (*disk[:3], "restarted")  # the same folder
    assert not Path(folder).exists()  # removed after the case
    assert servers.started[5:] == [(k, 1, documents.server_args(k), "")
                                   for k in running_kinds(running)]  # fmt: skip
    # after the restart: the second pass's questions
    assert [question(b) for b in seen.bodies[-6:-3]] == [documents.QUESTIONS[SECOND]] * 3


def running_kinds(running: list[Server]) -> list[str]:
    return [s.kind for s in running]


async def test_a_restart_that_does_not_start_is_a_reason_not_a_crash(aiohttp_server, tmp_path):
    seen = Recorder()
    port = await fake_url(aiohttp_server, seen)
    servers = FakeServers(with_binaries(tmp_path), port, fail=("restarted",))
    work = documents.Workload(servers, 3, (1,), seen.quiet)
    work.tokens_per_word = {EDGESERVE: 1.0}
    found = await work.restarted(EDGESERVE, tmp_path)
    assert found["error"] == f"did not start: {EDGESERVE} exited with 1: bad flag"
    assert servers.stopped == [EDGESERVE, EDGESERVE]  # after the first pass and the failure
    assert found["disk_first_ttft_p50_ms"] is not None and "restart_ttft_ms" not in found


def documents_result(
    second_ms: dict[str, float], restart_ms: float | None = 400.0, idle_mib: float = 320.0
) -> dict[str, Any]:
    """results["documents"]: each server's second pass at `second_ms` (±10% over its three
    documents), its first at 2 s; edgeserve's after restart `restart_ms` (None: skipped),
    the baseline skipped; idle RSS `idle_mib` for edgeserve, 300 MiB for the others."""
    out: dict[str, Any] = {
        "count": 3,
        "doc_tokens": 1500,
        "parallel": 2,
        "ctx": 4096,
        "max_tokens": 4,
        "idle_parallel": 1,
        "unsupported": {},
        "restart_skipped": {EDGESERVE_BASELINE: NO_DISK_TIER},
    }
    for kind, ms in second_ms.items():
        found = documents.figures(FIRST, streams(2000.0, 2000.0, 2000.0))
        found |= documents.figures(SECOND, streams(0.9 * ms, ms, 1.1 * ms, cached=1490))
        if kind == EDGESERVE and restart_ms is not None:
            found |= documents.figures("disk_first", streams(2100.0, 2100.0, 2100.0))
            found |= documents.figures("restart", streams(restart_ms, restart_ms, restart_ms))
            found |= {"stop_exit_code": 0, "disk_bytes": 96 * MIB}
        rss = idle_mib if kind == EDGESERVE else 300.0
        out[kind] = documents.with_totals(found | {"idle_rss": rss * MIB})
    if restart_ms is None:
        out["restart_skipped"][EDGESERVE] = "did not start: bad flag"
    return out


TITLE = "documents (3 never-seen documents of ~1500 tokens"
SERVERS = {EDGESERVE: 200.0, EDGESERVE_BASELINE: 400.0, LLAMA_SERVER: 250.0}


def test_report_beside_llama_server_and_the_previous_release():
    data = results()
    data["documents"] = documents_result(SERVERS)
    lines = lines_of(data)
    # edgeserve, baseline, llama-server, es/llama-server, vs previous
    assert row(lines, TITLE, "first-pass TTFT p50 ms") == ["2000", "2000", "2000", "1.00", "1.00"]
    assert row(lines, TITLE, "second-pass TTFT p50 ms") == ["200", "400", "250", "0.80", "0.50"]
    assert row(lines, TITLE, "second-pass cached tokens") == ["1490", "1490", "1490", "1.00",
                                                              "1.00"]  # fmt: skip
    assert row(lines, TITLE, "disk-tier first pass p50 ms") == ["2100", "n/a", "-", "-", "n/a"]
    assert row(lines, TITLE, "after-restart TTFT p50 ms") == ["400", "n/a", "-", "-", "n/a"]
    assert row(lines, TITLE, "after restart / warm") == ["2.00", "n/a", "-", "-", "n/a"]
    assert row(lines, TITLE, "idle RSS after a chat MiB") == ["320", "300", "300", "1.07", "1.07"]
    shown = block(lines, TITLE)
    assert (
        "  edgeserve disk tier: 96 MiB in --prompt-cache-dir after the first pass; the stop "
        "(SIGTERM) exited 0"
    ) in shown
    assert f"  {EDGESERVE_BASELINE} after restart: skipped ({NO_DISK_TIER})" in shown
    figures = {f.label: f for f in report.versus_previous(data)}
    second = figures["documents second-pass TTFT p50 ms"]
    assert second.noise == pytest.approx(0.2)  # 0.9x to 1.1x of the median
    assert not second.regressed()  # 200 against the baseline's 400
    assert "documents after-restart TTFT p50 ms" not in figures  # the baseline has none
    assert figures["documents streams cut short"].noise == 0.0


def test_a_server_that_did_not_start_is_n_a_throughout():
    data = results()
    data["documents"] = documents_result({EDGESERVE: 200.0, EDGESERVE_BASELINE: 400.0})
    data["documents"]["unsupported"] = {LLAMA_SERVER: "did not start: boom"}
    data["documents"][EDGESERVE]["second_errors"] = ["HTTP 500: x"]
    lines = lines_of(data)
    assert row(lines, TITLE, "second-pass TTFT p50 ms") == ["200", "400", "n/a", "n/a", "0.50"]
    assert f"  {LLAMA_SERVER} n/a: did not start: boom" in block(lines, TITLE)
    assert f"  {EDGESERVE} first error: HTTP 500: x" in block(lines, TITLE)


def checks_of(data: dict[str, Any]) -> dict[str, tuple[bool | None, str]]:
    return {what: (ok, why) for what, ok, why in report.targets(data)}


SECOND_TARGET = "documents: second-pass TTFT p50 <= llama-server's (its host-RAM prompt cache)"
RESTART_TARGET = "documents: after a restart on the disk tier, TTFT p50 <= 2x warm"
IDLE_TARGET = (
    "documents: idle RSS after one chat <= 1.1x llama-server's (--parallel 1, --ctx-size 4096)"
)


def test_the_documents_targets():
    data = results()
    assert not any(what.startswith("documents:") for what in checks_of(data))
    data["documents"] = documents_result(SERVERS, restart_ms=400.0, idle_mib=330.0)
    checks = checks_of(data)
    assert checks[SECOND_TARGET] == (True, "200 vs 250 ms (ratio 0.80)")
    assert checks[RESTART_TARGET] == (True, "400 vs 200 ms (ratio 2.00)")
    assert checks[IDLE_TARGET] == (True, "330 vs 300 MiB (ratio 1.10)")
    data["documents"] = documents_result(
        {**SERVERS, EDGESERVE: 300.0}, restart_ms=700.0, idle_mib=331.0
    )
    checks = checks_of(data)
    assert checks[SECOND_TARGET][0] is False
    assert checks[RESTART_TARGET] == (False, "700 vs 300 ms (ratio 2.33)")
    assert checks[IDLE_TARGET][0] is False
    data["documents"] = documents_result(SERVERS, restart_ms=None)
    assert checks_of(data)[RESTART_TARGET] == (None, "skipped: did not start: bad flag")
    assert "  [n/a ] " + RESTART_TARGET in report.targets_text(report.targets(data))


@pytest.fixture
def model(tmp_path: Path) -> Path:
    return vocab_gguf(tmp_path / "gemma.gguf", ("<pad>", "<eos>", "<end_of_turn>"), eos=1,
                      arch="gemma3", template=None)  # fmt: skip


def test_the_workload_runs_by_default_and_has_its_switches(model: Path, tmp_path: Path, capsys):
    args = parse_args(["--model", str(model)])
    assert (args.no_documents, args.documents_only, args.documents) == (False, False, 6)
    assert parse_args(["--model", str(model), "--quick"]).documents == 4
    assert parse_args(["--model", str(model), "--no-documents"]).no_documents
    assert parse_args(["--model", str(model), "--documents", "0"]).documents == 0
    for bad, said in (
        (["--documents-only", "--no-documents"], "exclude each other"),
        (["--documents-only", "--models-only"], "exclude each other"),
        (["--documents-only", "--long-prompt-only"], "exclude each other"),
        (["--documents", "2"], "--documents must be 0 or at least 3"),
    ):
        with pytest.raises(SystemExit):
            parse_args(["--model", str(model), *bad])
        assert said in capsys.readouterr().err
    alone = Bench(parse_args(["--model", str(model), "--out", str(tmp_path), "--quick",
                              "--documents-only"]), None)  # fmt: skip
    assert (alone.only, alone.levels, alone.speed_models) == ("documents", [], [])


def test_servers_and_their_help_never_import_the_bench_s_checkout(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """Started with PYTHONPATH=<checkout> (to run this bench), an edgeserve would import the
    checkout's code instead of its own install's: both edgeserves would be the checkout."""
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    seen = tmp_path / "env"
    script = tmp_path / "edgeserve"
    script.write_text(
        f'#!/bin/sh\necho "[$PYTHONPATH]" > {seen}\n'
        '[ -z "$PYTHONPATH" ] && echo --prompt-cache-dir\n'
    )
    script.chmod(0o755)
    setup = replace(bench_setup(tmp_path), edgeserve=script)
    assert documents.missing_disk_tier(EDGESERVE, setup) is None
    with Servers(setup) as servers:
        server = servers.start(EDGESERVE, 1)
        assert server.proc.wait(60) == 0
    assert seen.read_text() == "[]\n"
