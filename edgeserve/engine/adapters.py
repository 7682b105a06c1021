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
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from dataclasses import dataclass

from edgeserve.engine.types import AdapterSet


@dataclass(frozen=True)
class Adapter:
    """A loaded LoRA adapter: its id, the name requests choose it by, and its file."""

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

    def add(self, name: str, path: str) -> Adapter:
        """Record an adapter whose weights are loaded (engine thread); ValueError when the
        name is taken."""
        with self._lock:
            if name in self._by_name:
                raise ValueError(f"an adapter named {name!r} is already loaded")
            adapter = Adapter(self._next_id, name, path)
            self._next_id += 1
            self._by_name[name] = adapter
            return adapter

    def remove(self, name: str) -> Adapter | None:
        """Forget the adapter `name` (engine thread, before its weights are freed)."""
        with self._lock:
            return self._by_name.pop(name, None)
