"""The settings of runtime LoRA loading (--lora-dir, --max-loras, --allow-runtime-lora) and the
start-up checks of the LoRA settings: each a one-line ConfigError, exit status 2 in a real
process."""

from __future__ import annotations

from pathlib import Path

import pytest

from edgeserve.config import ConfigError, load_settings
from edgeserve.config import sources as config
from tests.unit.test_cli import serve_process

NO_KEY_ON_LAN = (
    "--allow-runtime-lora needs an API key on a non-loopback --host (here {host}): anyone who "
    "can reach the port could load adapters and choose what the model answers; set "
    "--api-key-file or API_KEY, or bind to 127.0.0.1"
)


@pytest.fixture(autouse=True)
def isolated(tmp_path, monkeypatch):
    """An empty working directory and no default model."""
    (tmp_path / "cwd").mkdir()
    monkeypatch.chdir(tmp_path / "cwd")
    monkeypatch.setattr(config, "REPO_ROOT", tmp_path / "repo")


@pytest.fixture
def model(tmp_path) -> Path:
    path = tmp_path / "tiny-model.gguf"
    path.write_bytes(b"GGUF")
    return path


def test_lora_dir_and_max_loras_from_flags_env_and_file(tmp_path, model):
    argv = ["--model", str(model)]
    (tmp_path / "cwd" / "adapters").mkdir()
    (tmp_path / "from-file").mkdir()
    default = load_settings(argv, {})
    assert (default.lora_dir, default.max_loras) == (None, 8)
    flags = load_settings([*argv, "--lora-dir", "adapters", "--max-loras", "3"], {})
    assert (flags.lora_dir, flags.max_loras) == (str(tmp_path / "cwd" / "adapters"), 3)
    engine = flags.engine_config()
    assert (engine.lora_dir, engine.max_loras) == (flags.lora_dir, 3)
    env = load_settings(argv, {"EDGESERVE_LORA_DIR": str(tmp_path), "EDGESERVE_MAX_LORAS": "2"})
    assert (env.lora_dir, env.max_loras) == (str(tmp_path), 2)
    toml = tmp_path / "edgeserve.toml"
    toml.write_text('lora-dir = "from-file"\nmax_loras = 1\n')
    from_file = load_settings([*argv, "--config", str(toml)], {})
    assert (from_file.lora_dir, from_file.max_loras) == (str(tmp_path / "from-file"), 1)


@pytest.mark.parametrize(
    ("argv", "environ", "message"),
    [
        (
            ["--lora-dir", "/nonexistent/adapters"],
            {},
            "LoRA folder not found: /nonexistent/adapters",
        ),
        (["--max-loras", "0"], {}, "invalid --max-loras: '0' must be at least 1"),
        (
            ["--lora", "a=a.gguf", "--lora", "b=b.gguf", "--max-loras", "1"],
            {},
            "2 --lora adapters, more than --max-loras 1",
        ),
        (
            ["--lora", "a=/x/a.gguf", "--lora", "b=/x/../x/a.gguf"],
            {},
            "--lora a and --lora b are the same file (/x/a.gguf): each file loads once (a full "
            "copy of its weights each time); give it one name",
        ),
        (
            ["--lora", "tiny-model=a.gguf"],
            {},
            "--lora tiny-model=...: an adapter may not have the model's name (--model-name), or "
            "every request for the model would run under it",
        ),
        (
            ["--lora", "chat=a.gguf", "--model-name", "chat"],
            {},
            "--lora chat=...: an adapter may not have the model's name (--model-name), or every "
            "request for the model would run under it",
        ),
        (["--allow-runtime-lora", "--host", "0.0.0.0"], {}, NO_KEY_ON_LAN.format(host="0.0.0.0")),
        (
            [],
            {"EDGESERVE_ALLOW_RUNTIME_LORA": "true", "API_HOST": "192.168.1.20"},
            NO_KEY_ON_LAN.format(host="192.168.1.20"),
        ),
    ],
)
def test_bad_lora_settings_are_one_line_errors(model, argv, environ, message):
    with pytest.raises(ConfigError) as caught:
        load_settings(["--model", str(model), *argv], environ)
    assert str(caught.value) == message


@pytest.mark.parametrize(
    ("argv", "environ"),
    [
        (["--allow-runtime-lora"], {}),
        (["--allow-runtime-lora", "--host", "::1"], {}),
        (["--allow-runtime-lora", "--host", "localhost"], {}),
        (["--allow-runtime-lora", "--host", "0.0.0.0"], {"API_KEY": "k"}),
        (["--host", "0.0.0.0"], {}),  # no runtime loading: a warning only (config.warnings)
    ],
)
def test_runtime_loading_on_loopback_or_behind_a_key_starts(model, argv, environ):
    load_settings(["--model", str(model), *argv], environ)


def test_runtime_loading_off_loopback_without_a_key_exits_2_in_a_real_process(model):
    done = serve_process(
        "--model", str(model), "--host", "0.0.0.0", EDGESERVE_ALLOW_RUNTIME_LORA="1"
    )
    assert done.returncode == 2
    assert done.stdout == ""
    assert done.stderr == f"edgeserve: error: {NO_KEY_ON_LAN.format(host='0.0.0.0')}\n"
