"""The prompt cache's disk tier (--prompt-cache-dir): entries as files that outlive the process.

Each model's entries live in a folder of their own, named by a hash of the model's cache
identity (its file, size and modification time, the context size, the KV cache's type and
layout, the llama.cpp build: whatever must match for a copied KV to mean the same thing), so
entries are never restored into another model or another context. A file is written to a
temporary name on a writer thread and renamed into place, so a crash leaves no half entry
under a real name. Its layout:

    MAGIC, a 4-byte little-endian header length, the header (JSON: format version, identity,
    token count, KV bytes, window checkpoints' positions and bytes, CRC-32 of the body), then
    the body: the tokens (8-byte little-endian each), the KV, the checkpoints' states.

A file that is truncated, corrupt, another identity's or not an entry at all is ignored with a
log line and deleted; never restored. All models' folders together stay within `cap_bytes`,
the least recently used files (by modification time, touched on each restore) going first.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import struct
import threading
import zlib
from array import array
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

from edgeserve.engine.prompt_store import SequenceState

log = logging.getLogger("edgeserve.engine")

MAGIC = b"edgeserve prompt cache\n"
VERSION = 1
SUFFIX = ".prompt"
_LENGTH = struct.Struct("<I")
_TOKEN = "q"  # array typecode of an 8-byte signed token id (media stand-ins are negative)


class BadEntry(ValueError):
    """An entry file that must not be restored."""


class PromptFiles:
    """One model's folder of entries under `root` (see the module docstring)."""

    def __init__(self, root: str | Path, identity: str, cap_bytes: int) -> None:
        self.root = Path(root)
        self.identity = hashlib.sha256(identity.encode()).hexdigest()
        self.folder = self.root / self.identity[:16]
        self.cap_bytes = cap_bytes
        self.folder.mkdir(parents=True, exist_ok=True)
        self._sizes: dict[str, int] = {}
        self._bytes = 0  # sum of _sizes, kept as it changes (read every engine step)
        self._lock = threading.Lock()
        self._writer = ThreadPoolExecutor(1, thread_name_prefix="edgeserve-cache-write")

    # ---- engine thread ----------------------------------------------------------------------

    def scan(self) -> list[tuple[str, list[int], int]]:
        """(file, tokens, bytes) of every valid entry of this model, oldest first; invalid
        files are logged and deleted, and leftover temporary files deleted."""
        found: list[tuple[float, str, list[int], int]] = []
        for path in self.folder.iterdir():
            if path.name.startswith("."):
                _unlink(path)
                continue
            try:
                tokens, size = self._read_header(path)
            except (OSError, BadEntry) as exc:
                self._reject(path, exc)
                continue
            found.append((path.stat().st_mtime, str(path), tokens, size))
            self._held(path, size)
        found.sort()
        if found:
            log.info("prompt cache: %d entries on disk in %s", len(found), self.folder)
        return [(file, tokens, size) for _, file, tokens, size in found]

    def write(self, tokens: list[int], state: SequenceState) -> str:
        """Start writing an entry holding `tokens`; the file it will be."""
        name = hashlib.sha256(array(_TOKEN, tokens).tobytes()).hexdigest()[:32] + SUFFIX
        path = self.folder / name
        self._writer.submit(self._write, path, list(tokens), state).add_done_callback(_logged)
        return str(path)

    def read(self, file: str, tokens: list[int]) -> SequenceState | None:
        """The entry in `file`, which should hold `tokens`; None when it is gone, or corrupt
        (logged, deleted). Its modification time is touched (most recently used)."""
        path = Path(file)
        try:
            with path.open("rb") as f:  # read into the one buffer the entry's state will be
                data = bytearray(os.fstat(f.fileno()).st_size)
                if f.readinto(data) != len(data):
                    raise BadEntry("shorter than its size when it was opened")
            state = self._parse(data, tokens)
        except FileNotFoundError:
            log.debug("prompt cache: %s is gone", path)
            return None
        except (OSError, BadEntry) as exc:
            self._reject(path, exc)
            return None
        with contextlib.suppress(OSError):
            os.utime(path)
        return state

    def forget(self, file: str) -> None:
        """Delete an entry's file (after the writes already started)."""
        self._writer.submit(self._delete, Path(file))

    def files_held(self) -> tuple[int, int]:
        """How many entry files this model has on disk now, and their bytes."""
        with self._lock:
            return len(self._sizes), self._bytes

    def close(self) -> None:
        """Finish the writes under way."""
        self._writer.shutdown(wait=True)

    # ---- the format -------------------------------------------------------------------------

    def _read_header(self, path: Path) -> tuple[list[int], int]:
        with path.open("rb") as f:
            size = os.fstat(f.fileno()).st_size
            header = self._header(f.read)
            if size != self._total(header):
                raise BadEntry(f"{size} bytes where the header says {self._total(header)}")
            tokens = array(_TOKEN)
            tokens.frombytes(f.read(8 * header["tokens"]))
        return tokens.tolist(), size

    def _header(self, read: Callable[[int], bytes]) -> dict:
        start = read(len(MAGIC) + _LENGTH.size)
        if len(start) < len(MAGIC) + _LENGTH.size or not start.startswith(MAGIC):
            raise BadEntry("not a prompt cache entry")
        (length,) = _LENGTH.unpack_from(start, len(MAGIC))
        raw = read(length)
        try:
            header = json.loads(raw)
            ok = (
                header["version"] == VERSION
                and isinstance(header["tokens"], int)
                and isinstance(header["kv"], int)
                and all(isinstance(p, int) and isinstance(n, int) for p, n in header["windows"])
                and isinstance(header["crc"], int)
            )
        except (ValueError, KeyError, TypeError) as exc:
            raise BadEntry(f"unreadable header ({exc})") from None
        if not ok:
            raise BadEntry("unreadable header")
        if header["identity"] != self.identity:
            raise BadEntry("written for another model file, context or cache type")
        header["_start"] = len(MAGIC) + _LENGTH.size + length
        return header

    @staticmethod
    def _total(header: dict) -> int:
        windows = sum(n for _, n in header["windows"])
        return header["_start"] + 8 * header["tokens"] + header["kv"] + windows

    def _parse(self, data: bytearray, tokens: list[int]) -> SequenceState:
        view = memoryview(data)
        header = self._header(_Reader(view))
        if len(data) != self._total(header):
            raise BadEntry(f"{len(data)} bytes where the header says {self._total(header)}")
        body = view[header["_start"] :]
        if zlib.crc32(body) != header["crc"]:
            raise BadEntry("checksum mismatch")
        stored = array(_TOKEN)
        stored.frombytes(body[: 8 * header["tokens"]])
        if stored.tolist() != tokens:
            raise BadEntry("holds other tokens than its index said")
        at = 8 * header["tokens"]
        kv = body[at : at + header["kv"]]
        at += header["kv"]
        windows = []
        for position, n in header["windows"]:
            windows.append((position, body[at : at + n]))
            at += n
        window_bytes = sum(n for _, n in header["windows"])
        return SequenceState(kv, header["kv"], tuple(windows), window_bytes)

    # ---- writer thread ----------------------------------------------------------------------

    def _write(self, path: Path, tokens: list[int], state: SequenceState) -> None:
        parts = [array(_TOKEN, tokens).tobytes(), memoryview(state.kv).cast("B")]  # type: ignore[arg-type]
        windows = [memoryview(w).cast("B") for _, w in state.windows]  # type: ignore[arg-type]
        parts += windows
        crc = 0
        for part in parts:
            crc = zlib.crc32(part, crc)
        header = json.dumps(
            {
                "version": VERSION,
                "identity": self.identity,
                "tokens": len(tokens),
                "kv": len(parts[1]),
                "windows": [[p, len(w)] for (p, _), w in zip(state.windows, windows, strict=True)],
                "crc": crc,
            }
        ).encode()
        temporary = path.with_name(f".{path.name}.{os.getpid()}")
        try:
            with temporary.open("wb") as f:
                f.write(MAGIC + _LENGTH.pack(len(header)) + header)
                for part in parts:
                    f.write(part)
            os.replace(temporary, path)
        except OSError as exc:
            log.warning("prompt cache: cannot write %s: %s", path, exc)
            _unlink(temporary)
            return
        self._held(path, path.stat().st_size)
        self._hold_cap()

    def _delete(self, path: Path) -> None:
        _unlink(path)
        with self._lock:
            self._bytes -= self._sizes.pop(str(path), 0)

    def _held(self, path: Path, size: int) -> None:
        with self._lock:
            self._bytes += size - self._sizes.get(str(path), 0)
            self._sizes[str(path)] = size

    def _hold_cap(self) -> None:
        """Delete the least recently used entry files of every model until all fit."""
        files = []
        for path in self.root.glob(f"*/*{SUFFIX}"):
            with contextlib.suppress(OSError):
                st = path.stat()
                files.append((st.st_mtime, st.st_size, path))
        total = sum(size for _, size, _ in files)
        for _, size, path in sorted(files, key=lambda f: f[0]):
            if total <= self.cap_bytes:
                break
            self._delete(path)
            total -= size

    def _reject(self, path: Path, exc: Exception) -> None:
        log.warning("prompt cache: ignoring %s: %s", path, exc)
        self._delete(path)


class _Reader:
    """Reads a memoryview from an offset on, as a file's `read` would."""

    def __init__(self, view: memoryview) -> None:
        self._view = view
        self._at = 0

    def __call__(self, n: int) -> bytes:
        chunk = bytes(self._view[self._at : self._at + n])
        self._at += n
        return chunk


def _logged(future: Future[None]) -> None:
    """Log what a write raised (the writer thread has no one else to tell)."""
    if (exc := future.exception()) is not None:
        log.error("prompt cache: a write failed", exc_info=exc)


def _unlink(path: Path) -> None:
    with contextlib.suppress(OSError):
        path.unlink()
