"""Logger names and logging setup: readable text, or one JSON object per line for journald.

Structured fields go in `extra`, e.g.
`logging.getLogger(ACCESS).info("request", extra={"request_id": rid, "status": 200})`;
both formats print them.
"""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime

ROOT = "edgeserve"
ACCESS = "edgeserve.access"  # one line per request
HTTP = "edgeserve.http"
ENGINE = "edgeserve.engine"
PROMPTS = "edgeserve.prompts"  # prompt text, only with --log-prompts (at debug level)

_HANDLER_NAME = "edgeserve"
_RECORD_ATTRS = frozenset(vars(logging.makeLogRecord({}))) | {"message", "asctime", "taskName"}


def _extras(record: logging.LogRecord) -> dict[str, object]:
    """The fields a caller passed with `extra=`."""
    return {k: v for k, v in vars(record).items() if k not in _RECORD_ATTRS}


class TextFormatter(logging.Formatter):
    """`2025-01-02 03:04:05,678 INFO edgeserve.access: request request_id=… status=200`."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")

    def formatMessage(self, record: logging.LogRecord) -> str:
        """The standard line followed by ` key=value` for each extra field."""
        fields = "".join(f" {key}={value}" for key, value in _extras(record).items())
        return super().formatMessage(record) + fields


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ts, level, logger, msg, then the extra fields (and exc)."""

    def format(self, record: logging.LogRecord) -> str:
        """Serialize `record` as a single line of JSON."""
        entry: dict[str, object] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key, value in _extras(record).items():
            entry.setdefault(key, value)
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        if record.stack_info:
            entry["stack"] = self.formatStack(record.stack_info)
        # ensure_ascii also escapes U+2028/U+2029, so the entry can never span two lines.
        return json.dumps(entry, default=str)


def setup_logging(level: str, fmt: str, *, log_prompts: bool = False) -> None:
    """Log to stderr as `fmt` ("text" or "json"); `level` applies to edgeserve's loggers.

    Other libraries log at WARNING or above. Prompt text (the PROMPTS logger, debug records)
    is shown only with `log_prompts`, whatever `level` is; without it that logger is disabled.
    Calling it again replaces the earlier setup.
    """
    numeric = logging.getLevelNamesMapping().get(level.upper())
    if numeric is None:
        raise ValueError(f"unknown log level {level!r}")
    if fmt not in ("text", "json"):
        raise ValueError(f"unknown log format {fmt!r}")
    handler = logging.StreamHandler(sys.stderr)
    handler.set_name(_HANDLER_NAME)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    root = logging.getLogger()
    for old in [h for h in root.handlers if h.get_name() == _HANDLER_NAME]:
        root.removeHandler(old)
        old.close()
    root.addHandler(handler)
    root.setLevel(max(numeric, logging.WARNING))
    logging.getLogger(ROOT).setLevel(numeric)
    prompts = logging.getLogger(PROMPTS)
    prompts.setLevel(logging.DEBUG if log_prompts else logging.NOTSET)
    prompts.disabled = not log_prompts
