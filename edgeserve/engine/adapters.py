"""LoRA adapters over the served model: which are loaded, by name and id.

An adapter is loaded once (at start with --lora NAME=PATH, or at run time when allowed) and
gets the next id; ids are never reused, so a request that names an adapter unloaded since
cannot run under another one loaded in its place. A request runs under an `AdapterSet`
(types.py): its adapters' ids with their scales. The engine groups the sequences of a
decode step by adapter set (planning.py), since llama.cpp applies one set per context at a
time, and keys the prefix cache by it (slots.py): KV computed under one set is never reused
under another.

The catalog is read from any thread (request checks, /v1/models) and changed only by the
engine thread, once the backend has loaded or freed the adapter's weights.

At run time (POST /v1/load_lora_adapter) an adapter loads only under `RuntimeLoading`'s rules:
from a file whose real path (symlinks resolved) lies in the LoRA folder (--lora-dir, else the
folders of the --lora files; with neither, from nowhere), under a name no adapter has, from a
file no adapter was loaded from (each load is a full copy of the weights), while fewer than
--max-loras adapters are loaded. The API refuses the names a client selects the served model
by (api/lora_adapters/routes.py).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from edgeserve.engine.types import AdapterSet, EngineConfig
from edgeserve.errors import AdapterRefused


@dataclass(frozen=True)
class Adapter:
    """A loaded LoRA adapter: its id, the name requests choose it by, and its file (the real
    path, symlinks resolved)."""

    id: int
    name: str
    path: str


def adapter_set(pairs: Iterable[tuple[int, float]]) -> AdapterSet:
    """The adapter set of (id, scale) pairs: sorted by id, an id named twice keeps its last
    scale, and zero scales are left out (an adapter at scale 0 is the base model)."""
    scales = dict(pairs)
    return tuple((adapter_id, scale) for adapter_id, scale in sorted(scales.items()) if scale)


class AdapterCatalog:
    """The loaded adapters by name and by id (see the module docstring)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_name: dict[str, Adapter] = {}
        self._next_id = 0

    def listed(self) -> list[Adapter]:
        """Every loaded adapter, in the order they were loaded."""
        with self._lock:
            return sorted(self._by_name.values(), key=lambda adapter: adapter.id)

    def named(self, name: str) -> Adapter | None:
        """The adapter loaded as `name`, if any."""
        with self._lock:
            return self._by_name.get(name)

    def with_id(self, adapter_id: int) -> Adapter | None:
        """The loaded adapter with id `adapter_id`, if any."""
        with self._lock:
            return next((a for a in self._by_name.values() if a.id == adapter_id), None)

    def next_id(self) -> int:
        """The id the next adapter added will get."""
        with self._lock:
            return self._next_id

    def loaded_from(self, path: str) -> Adapter | None:
        """The adapter loaded from the file at real path `path`, if any."""
        with self._lock:
            return next((a for a in self._by_name.values() if a.path == path), None)

    def __len__(self) -> int:
        with self._lock:
            return len(self._by_name)

    def add(self, name: str, path: str) -> Adapter:
        """Record an adapter whose weights are loaded from `path` (engine thread; kept as its
        real path); ValueError when the name is taken."""
        with self._lock:
            if name in self._by_name:
                raise ValueError(f"an adapter named {name!r} is already loaded")
            adapter = Adapter(self._next_id, name, os.path.realpath(path))
            self._next_id += 1
            self._by_name[name] = adapter
            return adapter

    def remove(self, name: str) -> Adapter | None:
        """Forget the adapter `name` (engine thread, before its weights are freed)."""
        with self._lock:
            return self._by_name.pop(name, None)


@dataclass(frozen=True)
class RuntimeLoading:
    """Which adapters may load at run time (see the module docstring): `folders` (real paths)
    hold their files, and at most `limit` adapters are loaded at once."""

    folders: tuple[str, ...]
    limit: int

    @classmethod
    def of(cls, config: EngineConfig) -> RuntimeLoading:
        """The rules `config` sets: --lora-dir, else the folders of the --lora files."""
        if config.lora_dir:
            dirs: Sequence[str] = (config.lora_dir,)
        else:
            dirs = [os.path.dirname(os.path.abspath(path)) for _, path in config.lora_adapters]
        return cls(tuple(dict.fromkeys(os.path.realpath(d) for d in dirs)), config.max_loras)

    def admit(self, catalog: AdapterCatalog, name: str, path: str) -> str:
        """The real path of the file to load as `name` from `path` (absolute, or relative to
        a folder: the first that holds it), or AdapterRefused by the first rule it breaks."""
        if catalog.named(name) is not None:
            raise AdapterRefused("name_taken", name, path)
        real = self._in_folder(name, path)
        loaded = catalog.loaded_from(real)
        if loaded is not None:
            raise AdapterRefused("file_loaded", name, path, loaded_as=loaded.name)
        if len(catalog) >= self.limit:
            raise AdapterRefused("full", name, path, limit=self.limit)
        return real

    def _in_folder(self, name: str, path: str) -> str:
        if not self.folders:
            raise AdapterRefused("no_folder", name, path)
        if "\0" in path:  # no file has such a name; os.path refuses it with ValueError
            raise AdapterRefused("outside_folder", name, path)
        inside = [
            real
            for real in (os.path.realpath(os.path.join(folder, path)) for folder in self.folders)
            if any(os.path.commonpath((real, folder)) == folder for folder in self.folders)
        ]
        if not inside:
            raise AdapterRefused("outside_folder", name, path)
        real_file = next((real for real in inside if os.path.isfile(real)), None)
        if real_file is None:
            raise AdapterRefused("not_a_file", name, path)
        return real_file
