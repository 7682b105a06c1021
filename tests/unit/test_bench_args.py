"""The bench's baseline options: --servers/--baseline parsing, the baseline's command line,
the grounded variants, and bench.baseline's choice of revision (in a scratch git repository)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from bench import baseline, grounded
from bench.__main__ import chosen_servers, parse_args
from bench.anchors import (
    ALL_SERVERS,
    EDGESERVE,
    EDGESERVE_BASELINE,
    LCP_SERVER,
    LLAMA_SERVER,
    Setup,
    command,
)
from tests.unit.bench_results import bench_setup


def test_servers_default_to_all_but_the_baseline_without_one():
    assert chosen_servers(None, None) == [EDGESERVE, LLAMA_SERVER, LCP_SERVER]


def test_a_baseline_runs_wherever_edgeserve_runs():
    assert chosen_servers(None, Path("es")) == list(ALL_SERVERS)
    assert chosen_servers("edgeserve", Path("es")) == [EDGESERVE, EDGESERVE_BASELINE]
    assert chosen_servers("llama-server,edgeserve", Path("es")) == [
        EDGESERVE,
        EDGESERVE_BASELINE,
        LLAMA_SERVER,
    ]
    assert chosen_servers("llama-server", Path("es")) == [LLAMA_SERVER]


def test_the_baseline_needs_a_binary_and_names_must_be_known():
    with pytest.raises(ValueError, match="needs --baseline"):
        chosen_servers("edgeserve,edgeserve-baseline", None)
    with pytest.raises(ValueError, match="unknown server"):
        chosen_servers("edgeserve,vllm", None)


@pytest.fixture
def model(tmp_path: Path) -> Path:
    path = tmp_path / "m.gguf"
    path.write_bytes(b"GGUF")
    return path


def test_parse_args_takes_the_baseline(model: Path, tmp_path: Path):
    exe = tmp_path / "edgeserve"
    exe.write_text("#!/bin/sh\n")
    exe.chmod(0o755)
    args = parse_args(["--model", str(model), "--baseline", str(exe), "--servers", "edgeserve"])
    assert args.baseline == exe
    assert args.servers == "edgeserve,edgeserve-baseline"
    args = parse_args(["--model", str(model), "--quick"])
    assert args.baseline is None
    assert args.servers == "edgeserve,llama-server,llama_cpp.server"
    assert (args.tokens, args.rounds) == (32, 2)


def test_parse_args_refuses_a_missing_baseline(model: Path, tmp_path: Path, capsys):
    with pytest.raises(SystemExit):
        parse_args(["--model", str(model), "--baseline", str(tmp_path / "nothing")])
    assert "is not an executable" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        parse_args(["--model", str(model), "--servers", "edgeserve-baseline"])
    assert "needs --baseline" in capsys.readouterr().err


def test_the_baseline_starts_exactly_like_edgeserve_from_its_own_binary(tmp_path: Path):
    setup = bench_setup(tmp_path)
    ours = command(EDGESERVE, setup, 8000, 4, ("--draft-max", "0"))
    theirs = command(EDGESERVE_BASELINE, setup, 8000, 4, ("--draft-max", "0"))
    assert theirs[0] == "/cache/abc/.venv/bin/edgeserve"
    assert theirs[1:] == ours[1:]
    with pytest.raises(ValueError, match="needs --baseline"):
        command(EDGESERVE_BASELINE, Setup(**{**setup.__dict__, "baseline": None}), 8000, 1)


def test_grounded_variants_of_the_baseline():
    assert grounded.edgeserve_spec(EDGESERVE_BASELINE) == {
        "edgeserve-baseline": (),
        "edgeserve-baseline no-spec": ("--draft-max", "0"),
    }
    assert grounded.kind_of("edgeserve-baseline no-spec") == EDGESERVE_BASELINE
    assert grounded.kind_of("llama-server ngram-mod") == LLAMA_SERVER
    assert grounded.no_spec(EDGESERVE) == "edgeserve no-spec"
    assert grounded.no_spec(LLAMA_SERVER) == "llama-server"


def git(repo: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t", *args],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()


def commit(repo: Path, path: str, text: str, message: str) -> str:
    (repo / path).parent.mkdir(parents=True, exist_ok=True)
    (repo / path).write_text(text)
    git(repo, "add", path)
    git(repo, "commit", "-q", "-m", message)
    return git(repo, "rev-parse", "HEAD")


@pytest.fixture
def repo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """main: server v1, server v2, a README-only commit (HEAD)."""
    monkeypatch.setenv("GIT_CONFIG_GLOBAL", "/dev/null")
    monkeypatch.setenv("GIT_CONFIG_NOSYSTEM", "1")
    root = tmp_path / "repo"
    root.mkdir()
    git(root, "init", "-q", "-b", "main")
    commit(root, "edgeserve/server.py", "v1\n", "server v1")
    commit(root, "edgeserve/server.py", "v2\n", "server v2")
    commit(root, "README.md", "docs\n", "docs only")
    return root


def test_auto_on_a_clean_main_is_the_last_commit_that_changed_the_server(repo: Path):
    v1 = git(repo, "rev-parse", "HEAD~2")
    assert baseline.resolve(repo, "auto") == v1


def test_auto_with_uncommitted_server_changes_is_head(repo: Path):
    (repo / "edgeserve" / "server.py").write_text("v3\n")
    assert baseline.resolve(repo, "auto") == git(repo, "rev-parse", "HEAD")


def test_auto_on_a_branch_is_where_it_left_main(repo: Path):
    fork = git(repo, "rev-parse", "HEAD")
    git(repo, "checkout", "-q", "-b", "feature")
    commit(repo, "edgeserve/server.py", "v3\n", "server v3")
    commit(repo, "edgeserve/other.py", "x\n", "more")
    commit(repo, "README.md", "later main\n", "ignored: not on main")
    assert baseline.resolve(repo, "auto") == fork


def test_explicit_revisions_and_none(repo: Path):
    assert baseline.resolve(repo, "none") is None
    assert baseline.resolve(repo, "HEAD~1") == git(repo, "rev-parse", "HEAD~1")
    with pytest.raises(SystemExit, match="not a commit"):
        baseline.resolve(repo, "no-such-rev")


def test_auto_without_main_says_what_to_set(repo: Path):
    git(repo, "branch", "-m", "main", "trunk")
    with pytest.raises(SystemExit, match="BASELINE="):
        baseline.resolve(repo, "auto")


def test_unpack_and_describe(repo: Path, tmp_path: Path):
    sha = git(repo, "rev-parse", "HEAD~1")
    dest = tmp_path / "cache" / sha[:12]
    baseline.unpack(repo, sha, dest)
    assert (dest / "edgeserve" / "server.py").read_text() == "v2\n"
    assert not (dest / "README.md").exists()
    exe = dest / ".venv" / "bin" / "edgeserve"
    assert baseline.describe(exe) == f"{sha} server v2"
    assert baseline.describe(Path(".venv/bin/edgeserve")) is None
