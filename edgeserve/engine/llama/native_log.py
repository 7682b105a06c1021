"""llama.cpp's log lines, routed into the `edgeserve.llama` logger or, while a file loads,
collected so that a failed load is reported as one line with llama.cpp's own reason."""

from __future__ import annotations

import contextlib
import ctypes
import logging
import re
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import llama_cpp.llama_cpp as lc

from edgeserve import llama_import

_llama_log = logging.getLogger("edgeserve.llama")

# ggml levels: 1 debug, 2 info (chatty load details, kept at debug here), 3 warn, 4 error, 5 cont.
_LEVELS = {1: logging.DEBUG, 2: logging.DEBUG, 3: logging.WARNING, 4: logging.ERROR}
# While a model loads, llama.cpp's errors are collected here (not logged) so that a failed load
# is reported as one line that includes llama.cpp's own first complaint.
_load_errors: list[str] | None = None
# While a context is made, the sizes of the buffers llama.cpp allocates in host memory.
_host_buffers: HostBuffers | None = None
_KV_BUFFER = re.compile(r"\bCPU KV buffer size =\s*([\d.]+) MiB")
_COMPUTE_BUFFER = re.compile(r"\bCPU compute buffer size =\s*([\d.]+) MiB")
# Compute buffers llama.cpp reserved outside the making of a context (on a decode after a
# context's LoRA adapters changed), by the thread that called it: each may have moved the
# compute buffer of a context that thread decodes in.
_late_reserves: dict[int, int] = {}
# While a context is made, what llama.cpp says of its flash attention: the type it is made with
# ("flash_attn = auto|enabled|disabled"), then, for auto, what the backend resolved it to
# ("Flash Attention enabled", "Flash Attention not supported, set to disabled").
_flash_attn_words: list[str] | None = None
# A CUDA build's complaint that it found no usable device (no GPU, no driver): kept, not logged,
# for the one line report_missing_gpu writes.
_CUDA_INIT_FAILED = re.compile(r"\bggml_cuda_init: failed to initialize CUDA: (.+)")
_cuda_failure: str | None = None
_gpu_reported = False
_FLASH_ATTN = re.compile(
    r"\bflash_attn +=\s*(auto|enabled|disabled)\b|\bFlash Attention (enabled|not supported)\b"
)


@lc.llama_log_callback
def _on_llama_log(level: int, text: bytes, _user: ctypes.c_void_p) -> None:
    """Route llama.cpp's own log lines into the `edgeserve.llama` logger."""
    py_level = _LEVELS.get(level, logging.DEBUG)
    line = text.decode("utf-8", "replace").rstrip()
    if match := _CUDA_INIT_FAILED.search(line):
        global _cuda_failure
        _cuda_failure = match[1]
        return
    if match := _KV_BUFFER.search(line):
        if _host_buffers is not None:
            _host_buffers.kv.append(_bytes(match[1]))
    elif match := _COMPUTE_BUFFER.search(line):
        _on_compute_buffer(_bytes(match[1]))
    if _flash_attn_words is not None and (match := _FLASH_ATTN.search(line)):
        _flash_attn_words.append(match[1] or match[2])
    if _load_errors is not None and py_level >= logging.ERROR:
        _load_errors.append(line)
    elif _llama_log.isEnabledFor(py_level):
        _llama_log.log(py_level, "%s", line)


def _bytes(mib: str) -> int:
    return round(float(mib) * 2**20)


def _on_compute_buffer(size: int) -> None:
    if _host_buffers is not None:
        _host_buffers.compute.append(size)
    else:
        thread = threading.get_ident()
        _late_reserves[thread] = _late_reserves.get(thread, 0) + 1


def late_reserves(thread: int) -> int:
    """How many compute buffers llama.cpp has reserved outside `host_buffers` blocks on
    `thread` (a `threading.get_ident()`)."""
    return _late_reserves.get(thread, 0)


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


def report_missing_gpu(offloads: bool) -> None:
    """Once per process, for a CUDA build that found no device: one warning that it serves on
    the CPU, with CUDA's reason."""
    global _gpu_reported
    if offloads or _gpu_reported or not llama_import.llama_has_cuda():
        return
    _gpu_reported = True
    _llama_log.warning(
        "no CUDA device found (%s): serving on the CPU", _cuda_failure or "CUDA lists none"
    )


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


@dataclass
class HostBuffers:
    """The byte sizes of the buffers llama.cpp allocated in host memory while a block made a
    context, from its log: its KV caches and its compute buffer (see pages.new_context)."""

    kv: list[int] = field(default_factory=list)
    compute: list[int] = field(default_factory=list)


@contextlib.contextmanager
def host_buffers() -> Iterator[HostBuffers]:
    """Collect the sizes of the host buffers llama.cpp allocates while the block makes a
    context."""
    global _host_buffers
    _host_buffers = found = HostBuffers()
    try:
        yield found
    finally:
        _host_buffers = None


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
