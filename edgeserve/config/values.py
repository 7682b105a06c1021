"""The values settings take: the text → value parsers, the fixed choices and names, and the
host facts some defaults and checks rest on (physical cores, loopback addresses).

A parser takes a flag or environment string, or a TOML value, and raises ValueError with a phrase
that completes "invalid --port: 'abc' ...".
"""

from __future__ import annotations

import ipaddress
import math
import os
import re
from collections.abc import Callable, Sequence
from pathlib import Path

from edgeserve import default_model

DEFAULT_MODEL_FILE = default_model.FILE
LOG_LEVELS = ("debug", "info", "warning", "error", "critical")
LOG_FORMATS = ("text", "json")
KV_CACHE_TYPES = ("f16", "q8_0", "q4_0")
FLASH_ATTN_MODES = ("auto", "on", "off")
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


def integer(low: int, high: int | None = None) -> Callable[[object], int]:
    """A parser of whole numbers from `low` (to `high`, if given)."""

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


def seconds(*, allow_zero: bool) -> Callable[[object], float]:
    """A parser of finite durations in seconds, above 0 (or at least 0 with `allow_zero`)."""

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


def boolean(raw: object) -> bool:
    """true/false, 1/0, yes/no or on/off (any case), or a TOML boolean."""
    if isinstance(raw, bool):
        return raw
    word = raw.strip().lower() if isinstance(raw, str) else None
    if word in _TRUE:
        return True
    if word in _FALSE:
        return False
    raise ValueError("is not a boolean (use true/false, 1/0, yes/no, on/off)")


def flash_attn_mode(raw: object) -> str:
    """auto, on or off (any case); a boolean's spellings (true/false, 1/0, yes/no, or a TOML
    boolean) still say on or off, as when flash attention was a switch."""
    if isinstance(raw, str) and (word := raw.strip().lower()) in FLASH_ATTN_MODES:
        return word
    try:
        return "on" if boolean(raw) else "off"
    except ValueError:
        raise ValueError(
            f"is not one of {', '.join(FLASH_ATTN_MODES)} (or a boolean: true/false, 1/0, yes/no)"
        ) from None


def text(raw: object) -> str:
    """A non-empty string, stripped."""
    if not isinstance(raw, str):
        raise ValueError("is not a string")
    if not raw.strip():
        raise ValueError("must not be empty")
    return raw.strip()


def choice(options: Sequence[str]) -> Callable[[object], str]:
    """A parser of one of `options`, in any case."""

    def parse(raw: object) -> str:
        value = text(raw).lower()
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


def lora_adapters(raw: object) -> tuple[tuple[str, str], ...]:
    """LoRA adapters as NAME=PATH entries (repeated flags, a comma-separated environment
    value, a TOML list) or a TOML table of name = path; names unique, without spaces."""
    if isinstance(raw, dict):
        entries = [(str(name), path) for name, path in raw.items()]
        if not all(isinstance(path, str) for _, path in entries):
            raise ValueError("maps a name to something that is not a path")
    else:
        entries = []
        for item in _strings(raw, split=True):
            name, sep, path = item.partition("=")
            if not sep:
                raise ValueError(f"has {item!r}, which is not NAME=PATH")
            entries.append((name.strip(), path.strip()))
    names = [name for name, _ in entries]
    for name, path in entries:
        if not name or any(c.isspace() for c in name) or not path:
            raise ValueError(f"has {name!r}={path!r}: a name without spaces and a path are needed")
        if names.count(name) > 1:
            raise ValueError(f"names the adapter {name!r} twice")
    return tuple(entries)


def api_keys(raw: object) -> tuple[str, ...]:
    """One key (a flag or environment value) or a TOML list of keys; at least one."""
    keys = _strings(raw, split=False)
    if not keys:
        raise ValueError("must not be empty")
    return keys


def origins(raw: object) -> tuple[str, ...]:
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


def hosts(raw: object) -> tuple[str, ...]:
    """Host names (a leading dot: the name and its subdomains), IP addresses or `*`."""
    hosts = []
    for item in _strings(raw, split=True):
        host = item.lower().rstrip(".").removeprefix("[").removesuffix("]")
        if not host or any(c in host for c in "/ @"):
            raise ValueError(f"has {item!r}, which is not a host name, an IP address or {ANY_HOST}")
        hosts.append(host)
    return tuple(hosts)


def root_path(raw: object) -> str:
    """A URL path prefix: empty, or starting with "/" (a trailing slash dropped)."""
    if not isinstance(raw, str):
        raise ValueError("is not a string")
    value = raw.strip()
    if value and not value.startswith("/"):
        raise ValueError("must start with '/'")
    return value.rstrip("/")


def names(raw: object) -> tuple[str, ...]:
    """One name or a list of names (comma-separated in a flag), each without spaces."""
    found = _strings(raw, split=True)
    for name in found:
        if any(c.isspace() for c in name):
            raise ValueError(f"has {name!r}: a name without spaces is needed")
    return found


_DURATION_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}
_DURATION = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ms|s|m|h)")


def keep_alive(raw: object) -> float:
    """How long a model stays loaded after its last request, as Ollama's `keep_alive`: seconds
    (a number) or a duration ("5m", "1h30m", "90s"); 0 unloads at once, a negative value keeps
    it loaded (returned as infinity)."""
    if isinstance(raw, bool):
        raise ValueError("is not a number of seconds or a duration like 5m")
    if isinstance(raw, int | float):
        value = float(raw)
    elif isinstance(raw, str):
        text = raw.strip().lower()
        sign = -1.0 if text.startswith("-") else 1.0
        body = text.lstrip("+-")
        try:
            value = sign * float(body)
        except ValueError:
            parts = _DURATION.findall(body)
            if not body or "".join(n + u for n, u in parts) != body:
                raise ValueError("is not a number of seconds or a duration like 5m") from None
            value = sign * sum(float(n) * _DURATION_UNITS[u] for n, u in parts)
    else:
        raise ValueError("is not a number of seconds or a duration like 5m")
    if math.isnan(value):
        raise ValueError("is not a number of seconds or a duration like 5m")
    return math.inf if value < 0 else value


_SIZE_UNITS = {
    "": 1, "b": 1,
    "k": 2**10, "kb": 10**3, "kib": 2**10,
    "m": 2**20, "mb": 10**6, "mib": 2**20,
    "g": 2**30, "gb": 10**9, "gib": 2**30,
    "t": 2**40, "tb": 10**12, "tib": 2**40,
}  # fmt: skip
_SIZE = re.compile(r"(\d+(?:\.\d*)?)\s*([a-z]*)")


def byte_size(raw: object) -> int:
    """A memory size: bytes, or a number with a unit ("8G", "512MiB", "1.5GB"); above 0."""
    if isinstance(raw, bool):
        raise ValueError("is not a size like 8G or 512MiB")
    if isinstance(raw, int):
        value = raw
    elif isinstance(raw, str) and (match := _SIZE.fullmatch(raw.strip().lower())):
        number, unit = match.groups()
        if unit not in _SIZE_UNITS:
            raise ValueError("is not a size like 8G or 512MiB")
        value = int(float(number) * _SIZE_UNITS[unit])
    else:
        raise ValueError("is not a size like 8G or 512MiB")
    if value <= 0:
        raise ValueError("must be greater than 0")
    return value


def byte_size_or_off(raw: object) -> int:
    """A memory size as `byte_size` takes it, or 0 (off)."""
    if raw in (0, "0"):
        return 0
    return byte_size(raw)


def physical_memory() -> int:
    """Bytes of physical memory (0 where unknown)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 0


def default_models_budget() -> int:
    """75% of the memory available now (MemAvailable), or 0 (no budget) where unknown: the
    default of --models-memory."""
    try:
        with open("/proc/meminfo", encoding="ascii") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024 * 3 // 4
    except (OSError, ValueError):
        pass
    return 0


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


def is_loopback(host: str) -> bool:
    """Whether `host` (a name or an IP address) is this machine's loopback."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
