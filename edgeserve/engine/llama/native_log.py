"""llama.cpp's log lines, routed into the `edgeserve.llama` logger or, while a file loads,
collected so that a failed load is reported as one line with llama.cpp's own reason."""

from __future__ import annotations

import contextlib
import ctypes
import logging
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import llama_cpp as lc

_llama_log = logging.getLogger("edgeserve.llama")

# ggml levels: 1 debug, 2 info (chatty load details, kept at debug here), 3 warn, 4 error, 5 cont.
_LEVELS = {1: logging.DEBUG, 2: logging.DEBUG, 3: logging.WARNING, 4: logging.ERROR}
# While a model loads, llama.cpp's errors are collected here (not logged) so that a failed load
# is reported as one line that includes llama.cpp's own first complaint.
_load_errors: list[str] | None = None
# While a context is made, the sizes of the KV buffers llama.cpp allocates in host memory.
_kv_sizes: list[int] | None = None
_KV_BUFFER = re.compile(r"\bCPU KV buffer size =\s*([\d.]+) MiB")
# While a context is made, what llama.cpp says of its flash attention: the type it is made with
# ("flash_attn = auto|enabled|disabled"), then, for auto, what the backend resolved it to
# ("Flash Attention enabled", "Flash Attention not supported, set to disabled").
_flash_attn_words: list[str] | None = None
_FLASH_ATTN = re.compile(
    r"\bflash_attn +=\s*(auto|enabled|disabled)\b|\bFlash Attention (enabled|not supported)\b"
)


@lc.llama_log_callback
def _on_llama_log(level: int, text: bytes, _user: ctypes.c_void_p) -> None:
    """Route llama.cpp's own log lines into the `edgeserve.llama` logger."""
    py_level = _LEVELS.get(level, logging.DEBUG)
    line = text.decode("utf-8", "replace").rstrip()
    if _kv_sizes is not None and (match := _KV_BUFFER.search(line)):
        _kv_sizes.append(round(float(match[1]) * 2**20))
    if _flash_attn_words is not None and (match := _FLASH_ATTN.search(line)):
        _flash_attn_words.append(match[1] or match[2])
    if _load_errors is not None and py_level >= logging.ERROR:
        _load_errors.append(line)
    elif _llama_log.isEnabledFor(py_level):
        _llama_log.log(py_level, "%s", line)


def native_log_callback() -> Any:
    """The ctypes callback that routes llama.cpp's log lines into the `edgeserve.llama`
    logger (libmtmd takes it too)."""
    return _on_llama_log


_backend_ready = False


def init_backend() -> None:
    """Route llama.cpp's log into logging and initialise its backends (once)."""
    global _backend_ready
    if not _backend_ready:
        lc.llama_log_set(_on_llama_log, ctypes.c_void_p(0))
        lc.llama_backend_init()
        _backend_ready = True


@contextlib.contextmanager
def native_complaints() -> Iterator[list[str]]:
    """Collect llama.cpp's error lines (instead of logging them) while the block loads a
    file, so that a failure is reported as one line with llama.cpp's own reason."""
    global _load_errors
    _load_errors = complaints = []
    try:
        yield complaints
    finally:
        _load_errors = None


def first_complaint(complaints: list[str]) -> str:
    """llama.cpp's first error line without its function prefix ("unknown error" if none)."""
    return complaints[0].split(": ", 1)[-1] if complaints else "unknown error"


@contextlib.contextmanager
def host_kv_buffers() -> Iterator[list[int]]:
    """Collect the byte sizes of the KV buffers llama.cpp allocates in host memory while the
    block makes a context (from its log; see pages.release_cleared)."""
    global _kv_sizes
    _kv_sizes = sizes = []
    try:
        yield sizes
    finally:
        _kv_sizes = None


@dataclass
class FlashAttention:
    """Whether a context runs flash attention, from llama.cpp's log while it is made (the C
    API does not say): `on` is None until the block ends, and stays None if the log did not
    say."""

    on: bool | None = None


@contextlib.contextmanager
def flash_attention() -> Iterator[FlashAttention]:
    """Read from llama.cpp's log whether the context the block makes runs flash attention."""
    global _flash_attn_words
    _flash_attn_words = words = []
    found = FlashAttention()
    try:
        yield found
    finally:
        _flash_attn_words = None
        last = words[-1] if words else "auto"  # auto unresolved: unknown
        found.on = {"enabled": True, "disabled": False, "not supported": False}.get(last)
