"""Settings for `edgeserve serve`.

One table drives everything: each field of `Settings` carries its parser and help text, and from it
come the command-line flag (`--ctx-size`), the environment names (`EDGESERVE_CTX_SIZE`, or the
reference server's `API_*` names) and the TOML key (the field name; dashes or underscores).
Precedence for every setting: flag > environment > config file > default.

`values` holds the parsers and fixed names, `settings` the `Settings` dataclass, `sources` the
reading of flags, environment and config file; this package re-exports what callers use.
"""

from edgeserve.config.settings import Settings
from edgeserve.config.sources import (
    NO_MODEL,
    NO_MODEL_CHECKOUT,
    OPTIONS,
    ArgumentParser,
    add_arguments,
    load_settings,
    no_model_message,
    read_api_key_file,
    warnings,
)
from edgeserve.config.values import (
    ANY_HOST,
    CORS_ANY,
    CORS_LOCAL,
    CORS_REFERENCE,
    DEFAULT_MODEL_FILE,
    ConfigError,
    is_loopback,
    physical_cores,
)

__all__ = [
    "ANY_HOST",
    "CORS_ANY",
    "CORS_LOCAL",
    "CORS_REFERENCE",
    "DEFAULT_MODEL_FILE",
    "NO_MODEL",
    "NO_MODEL_CHECKOUT",
    "OPTIONS",
    "ArgumentParser",
    "ConfigError",
    "Settings",
    "add_arguments",
    "is_loopback",
    "load_settings",
    "no_model_message",
    "physical_cores",
    "read_api_key_file",
    "warnings",
]
