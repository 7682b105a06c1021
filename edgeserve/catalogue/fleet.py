"""The fleet: the catalogue's models at run time, each loaded on demand by the first request
that names it, within one memory budget, and unloaded when idle.

- A request holds its model with `lease` for as long as it runs; a model with a lease (a
  running or queued request) is never unloaded.
- Loads run one at a time. Before one, idle models unload, least recently used first, until
  the new model's estimated footprint (footprint.py) fits `memory_budget` beside the loaded
  ones and fewer than `max_loaded` are loaded; when nothing can make room the request gets
  `ModelUnavailable` (503 with Retry-After and the reason) and nothing is unloaded for it.
- Each engine runs its own thread, so a load (on its thread) and the other models' steps go on
  side by side; a model that fails to load fails its own requests and leaves the others.
- After its last lease a model stays loaded for its keep-alive (the entry's, the last request's
  `keep_alive`, else the server's): 0 unloads it at once, infinity never; pinned entries (and
  `--model` alone) never unload.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import time
from collections.abc import AsyncIterator, Callable, Coroutine
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from edgeserve.catalogue.entries import Catalogue, ModelEntry
from edgeserve.catalogue.footprint import Footprint, estimate, resident_bytes
from edgeserve.catalogue.status import ModelState, Status
from edgeserve.engine.client import EngineClient
from edgeserve.engine.types import EngineConfig, EngineStats
from edgeserve.engine.worker import Engine
from edgeserve.errors import ModelRefused, ModelUnavailable, UnknownModel

log = logging.getLogger("edgeserve.models")

MIB = 2**20
# Retry-After of a request that found no room: the running requests that hold the memory are
# expected to end within this many seconds.
NO_ROOM_RETRY_S = 5
# Retry-After of a request for a model that failed to load.
FAILED_RETRY_S = 30


EngineFactory = Callable[[EngineConfig], Engine]


@dataclass
class Held:
    """One catalogue entry at run time."""

    entry: ModelEntry
    estimate: Footprint | None
    status: Status = Status.UNLOADED
    engine: Engine | None = None
    client: EngineClient | None = None
    measured: int | None = None  # bytes the process grew by when it loaded
    failure: str | None = None  # why the last load failed or was refused
    leases: int = 0
    last_used: float = 0.0  # time.monotonic() of the last lease's end
    expires_at: float | None = None  # time.time() when an idle unload is due
    keep_alive: float | None = None  # the last request's keep_alive, when it gave one
    loading: asyncio.Future[None] | None = None
    timer: asyncio.TimerHandle | None = None
    retired: bool = False  # replaced or removed from the catalogue: unloads after its last lease
    signature: tuple[int, int] | None = None  # the model file's (size, mtime) when listed

    @property
    def charge(self) -> int:
        """The bytes this model counts against the budget: its estimate, or what it measured
        when that is more."""
        estimated = self.estimate.total if self.estimate else 0
        return max(estimated, self.measured or 0)


class Fleet:
    """The models of a catalogue and their engines (see the module docstring). Lives on the
    event loop: every method is called from it."""

    def __init__(
        self,
        catalogue: Catalogue,
        *,
        memory_budget: int,
        max_loaded: int,
        keep_alive: float,
        factory: EngineFactory = Engine,
        source: Callable[[], Catalogue] | None = None,
        files_dir: str | None = None,
        estimator: Callable[[EngineConfig], Footprint] = estimate,
    ) -> None:
        self.catalogue = catalogue
        self.memory_budget = memory_budget
        self.max_loaded = max_loaded
        self.keep_alive = keep_alive
        self._factory = factory
        self._source = source  # reads the catalogue anew (`rescan`)
        self.files_dir = files_dir  # where POST /models/load may take a new file from
        self._estimator = estimator
        self._held = {entry.id: self._new(entry) for entry in catalogue.entries.values()}
        self._retired: list[Held] = []  # replaced or removed, still running requests
        self._load_lock = asyncio.Lock()
        self._closing = False
        self._tasks: set[asyncio.Future[None]] = set()  # background unloads

    @classmethod
    def serving(cls, model_id: str, client: EngineClient, config: EngineConfig) -> Fleet:
        """A fleet of the one model of `--model` alone, whose engine the caller made and owns
        (it loads by itself; requests get its 503 until it has)."""
        entry = ModelEntry(id=model_id, config=config, load_at_start=True, pinned=True)
        fleet = cls(Catalogue([entry], single=True), memory_budget=0, max_loaded=1, keep_alive=0)
        held = fleet._held[model_id]
        held.engine, held.client = getattr(client, "engine", None), client
        held.status = Status.LOADED if client.loaded else Status.LOADING
        return fleet

    # ---- what requests use ------------------------------------------------------------------

    @property
    def closing(self) -> bool:
        """Whether the server is stopping (no model loads any more)."""
        return self._closing

    @property
    def single(self) -> bool:
        """Whether this is `--model` alone (any name is the one model)."""
        return self.catalogue.single

    def held(self, name: str | None) -> Held:
        """The model `name` names (UnknownModel when none)."""
        entry = self.catalogue.resolve(name)
        if entry is None:
            raise UnknownModel(name, self.catalogue.ids())
        return self._held[entry.id]

    @contextlib.asynccontextmanager
    async def lease(self, name: str | None, keep_alive: float | None = None) -> AsyncIterator[Held]:
        """Hold the model `name` names for a request (loaded first when it is not, waiting
        for the load: its `client` is then set); released on leaving."""
        held = self.held(name)
        held.leases += 1
        self._cancel_timer(held)
        try:
            await self._ensure_loaded(held)
            assert held.client is not None
            yield held
        finally:
            held.leases -= 1
            held.last_used = time.monotonic()
            if keep_alive is not None:
                held.keep_alive = keep_alive
            if held.leases == 0:
                self._schedule_unload(held)

    def release(self, name: str | None) -> Held:
        """The model `name` names, to unload as soon as no request holds it (never loaded for
        this: Ollama's keep_alive 0 with nothing to run). A pinned model stays; one not loaded
        keeps its keep-alive for its next load."""
        held = self.held(name)
        if held.status in (Status.LOADED, Status.LOADING):  # else there is nothing to unload
            held.keep_alive = 0.0
            if held.leases == 0:
                self._schedule_unload(held)
        return held

    def client(self, name: str | None) -> EngineClient | None:
        """The engine client of a loaded (or loading) model, without holding it: for
        figures and for a single model's routes that need no lease."""
        return self.held(name).client

    # ---- loading and unloading --------------------------------------------------------------

    async def start(self) -> None:
        """Load the entries marked to load at start (one at a time; a failure is logged and
        left in the model's status)."""
        for held in self._held.values():
            if held.entry.load_at_start and held.status is Status.UNLOADED:
                with contextlib.suppress(ModelUnavailable):
                    await self._ensure_loaded(held)

    def rescan(self) -> None:
        """Read the catalogue anew (SIGHUP, GET /models?reload=1): see `reload`."""
        if self._source is not None:
            self.reload(self._source())

    def reload(self, catalogue: Catalogue) -> None:
        """Serve `catalogue` from now on: new entries appear; an entry whose file or settings
        changed is a new model under the same id, loaded on its next request, while the old
        one finishes its running requests and unloads; a removed entry unloads once its
        running requests end."""
        if self.single:
            return
        kept: dict[str, Held] = {}
        for entry in catalogue.entries.values():
            old = self._held.get(entry.id)
            if (
                old is not None
                and old.entry.config == entry.config
                and old.signature == (_signature(entry.config))
            ):
                old.entry = entry
                kept[entry.id] = old
            else:
                kept[entry.id] = self._new(entry)
                if old is not None:
                    self._retire(old)
        for model_id, old in self._held.items():
            if model_id not in kept:
                self._retire(old)
        self._held, self.catalogue = kept, catalogue
        log.info("catalogue read anew: %s", ", ".join(catalogue.ids()) or "no models")

    def _retire(self, held: Held) -> None:
        held.retired = True
        if held.engine is None:
            return
        self._retired.append(held)
        if held.leases == 0 and held.loading is None:
            self._unload_soon(held)

    async def load(self, name: str, path: str | None = None) -> Held:
        """Load the model `name` names now (POST /models/load), from the GGUF at `path`
        when given (a new file for the id: the old version serves its running requests and
        unloads); its state afterwards."""
        held = self.held(name)
        if path is not None and path != held.entry.config.model_path:
            return await self._swap(held, path)
        await self._ensure_loaded(held)
        self._schedule_unload(held)
        return held

    async def _swap(self, old: Held, path: str) -> Held:
        """Load the GGUF at `path` as a new version of `old`'s model beside it; once it has
        loaded, new requests go to it and the old one unloads after its running requests (a
        file that fails to load leaves the old one serving)."""
        if self.files_dir is None or not Path(path).resolve().is_relative_to(
            Path(self.files_dir).resolve()
        ):
            raise ModelRefused(f"a new file for a model must be inside --models-dir ({path})")
        if not Path(path).is_file():
            raise ModelRefused(f"no such model file: {path}")
        entry = replace(old.entry, config=replace(old.entry.config, model_path=path))
        new = self._new(entry)
        if new.estimate is None:
            raise ModelRefused(f"{path} is not a GGUF model file")
        new.leases += 1  # not idle while it loads: no unload before the swap
        try:
            await self._ensure_loaded(new)
        finally:
            new.leases -= 1
        if self._held.get(entry.id) is old:
            self._held[entry.id] = new
            self.catalogue.entries[entry.id] = entry
            self._retire(old)
        self._schedule_unload(new)
        return new

    async def unload(self, name: str) -> Held:
        """Unload the model `name` names once its running requests end (POST /models/unload)."""
        held = self.held(name)
        if held.entry.pinned:
            raise ModelRefused(f"model {held.entry.id!r} is pinned: it is never unloaded")
        if held.loading is not None:
            with contextlib.suppress(ModelUnavailable):
                await asyncio.shield(held.loading)
        if held.status is Status.LOADED and held.leases == 0:
            await self._unload(held)
        else:
            held.keep_alive = 0.0  # at its last lease's end
        return held

    async def close(self) -> None:
        """Unload every model (the server is stopping)."""
        self._closing = True
        for held in self._everyone():
            self._cancel_timer(held)
            if held.engine is not None:
                held.engine.stop_accepting()
        await asyncio.gather(*(self._unload(h) for h in self._everyone() if h.engine))

    async def _ensure_loaded(self, held: Held) -> None:
        if self.single and held.client is not None:
            return  # --model alone: the engine loads itself, and answers 503 until it has
        while held.status is not Status.LOADED:
            if self._closing:
                raise ModelUnavailable(f"the server is stopping; {held.entry.id} is not loaded", 5)
            if held.loading is None:
                held.loading = asyncio.ensure_future(self._load(held))
            await asyncio.shield(held.loading)

    async def _load(self, held: Held) -> None:
        try:
            async with self._load_lock:
                if held.status is Status.LOADED:
                    return
                try:
                    await self._make_room(held)
                except ModelUnavailable as exc:
                    held.failure = exc.reason  # shown with its status until a load starts
                    raise
                held.status, held.failure = Status.LOADING, None
                started, before = time.perf_counter(), resident_bytes()
                engine = self._factory(held.entry.config)
                engine.start()
                if not await asyncio.to_thread(engine.wait_loaded):
                    held.status, held.failure = Status.FAILED, str(engine.load_error)
                    await asyncio.to_thread(engine.close)
                    log.error("model %s failed to load: %s", held.entry.id, held.failure)
                    raise ModelUnavailable(
                        f"model {held.entry.id!r} failed to load: {held.failure}", FAILED_RETRY_S
                    )
                held.measured = max(0, resident_bytes() - before)
                held.engine, held.client = engine, EngineClient(engine)
                held.status = Status.LOADED
                log.info(
                    "model %s loaded in %.1fs (%.0f MiB; estimated %.0f)",
                    held.entry.id,
                    time.perf_counter() - started,
                    held.measured / MIB,
                    held.estimate.total / MIB if held.estimate else math.nan,
                )
        finally:
            held.loading = None

    async def _make_room(self, held: Held) -> None:
        """Unload idle models, least recently used first, until `held` fits the budget and
        the count; ModelUnavailable when it cannot."""
        if held.estimate is None:
            return  # an unreadable file: its load says why
        need = held.estimate.total
        if self.memory_budget and need > self.memory_budget:
            raise ModelUnavailable(
                f"model {held.entry.id!r} needs about {need / MIB:.0f} MiB, more than the "
                f"models' memory budget of {self.memory_budget / MIB:.0f} MiB (--models-memory)",
                FAILED_RETRY_S,
            )
        while True:
            others = [
                h
                for h in self._everyone()
                if h is not held and h.status in (Status.LOADED, Status.LOADING)
            ]
            used = sum(h.charge for h in others)
            fits = not self.memory_budget or used + need <= self.memory_budget
            if fits and len(others) < self.max_loaded:
                return
            idle = [
                h
                for h in others
                if h.status is Status.LOADED and h.leases == 0 and not h.entry.pinned
            ]
            if not idle:
                busy = ", ".join(sorted(h.entry.id for h in others))
                raise ModelUnavailable(
                    f"no room to load {held.entry.id!r} (about {need / MIB:.0f} MiB): "
                    f"{used / MIB:.0f} of {self.memory_budget / MIB:.0f} MiB and "
                    f"{len(others)} of {self.max_loaded} models are held by models with "
                    f"running requests or pinned ({busy})",
                    NO_ROOM_RETRY_S,
                )
            await self._unload(min(idle, key=lambda h: h.last_used))

    def _everyone(self) -> list[Held]:
        """The catalogue's models and the retired ones still loaded."""
        return [*self._held.values(), *self._retired]

    async def _unload(self, held: Held) -> None:
        await self._close(held.entry.id, self._detach(held))

    def _detach(self, held: Held) -> Engine | None:
        """Take `held`'s engine away at once (a request arriving now loads the model anew)
        and return it for `_close`."""
        engine = held.engine
        self._cancel_timer(held)
        if held in self._retired:
            self._retired.remove(held)
        held.engine, held.client = None, None
        held.status, held.measured = Status.UNLOADED, None
        if engine is not None:
            engine.stop_accepting()
        return engine

    async def _close(self, model_id: str, engine: Engine | None) -> None:
        """Free a detached engine's model (on a worker thread: it joins the engine thread)."""
        if engine is not None:
            await asyncio.to_thread(engine.close)
            log.info("model %s unloaded", model_id)

    def _unload_soon(self, held: Held) -> None:
        """Unload `held` now, its memory freed in the background."""
        self._spawn(self._close(held.entry.id, self._detach(held)))

    def _schedule_unload(self, held: Held) -> None:
        """After the last lease: an unload when the keep-alive is over (none for pinned)."""
        self._cancel_timer(held)
        if held.retired and held.engine is not None:
            self._unload_soon(held)
            return
        if held.entry.pinned or held.status is not Status.LOADED or self._closing:
            return
        keep = held.keep_alive
        if keep is None:
            keep = self.keep_alive if held.entry.keep_alive is None else held.entry.keep_alive
        if math.isinf(keep):
            return
        held.expires_at = time.time() + keep
        loop = asyncio.get_running_loop()
        held.timer = loop.call_later(keep, self._idle_unload, held)

    def _idle_unload(self, held: Held) -> None:
        held.timer = None
        if held.leases == 0 and held.status is Status.LOADED and held.loading is None:
            held.keep_alive = None
            self._unload_soon(held)

    def _new(self, entry: ModelEntry) -> Held:
        """A catalogue entry's run-time state, its footprint estimated (None when its file
        cannot be read: its load then says why)."""
        try:
            footprint: Footprint | None = self._estimator(entry.config)
        except (OSError, ValueError) as exc:
            if not self.single:  # --model alone: the estimate is only shown
                log.warning(
                    "cannot read %s to estimate its memory: %s", entry.config.model_path, exc
                )
            footprint = None
        return Held(entry, footprint, signature=_signature(entry.config))

    def _spawn(self, work: Coroutine[Any, Any, None]) -> None:
        """Run `work` in the background, holding it until it ends."""
        task = asyncio.ensure_future(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _cancel_timer(self, held: Held) -> None:
        if held.timer is not None:
            held.timer.cancel()
            held.timer = None
        held.expires_at = None

    # ---- figures ----------------------------------------------------------------------------

    def models(self) -> list[Held]:
        """Every model, by id."""
        for held in self._held.values():
            client = held.client
            if self.single and held.status is Status.LOADING and client and client.loaded:
                held.status = Status.LOADED  # the caller's engine (`serving`) has loaded
        return [self._held[i] for i in self.catalogue.ids()]

    async def watch(self, interval: float = 1.0) -> None:
        """Forever: a model whose engine thread has ended (a crash) is marked failed and
        dropped, so that its next request loads it anew; the others serve on."""
        while True:
            for held in self._held.values():
                engine = held.engine
                if held.status is Status.LOADED and engine is not None and not engine.running:
                    log.error(
                        "model %s: its engine thread stopped; it loads again on its next request",
                        held.entry.id,
                    )
                    held.engine, held.client = None, None
                    held.status, held.failure = Status.FAILED, "the engine thread stopped"
            await asyncio.sleep(interval)

    def states(self) -> list[ModelState]:
        """Every model's state now, by id."""
        return [
            ModelState(
                id=h.entry.id,
                aliases=h.entry.aliases,
                status=h.status,
                failure=h.failure,
                estimated=h.estimate.total if h.estimate else None,
                measured=h.measured,
                expires_at=h.expires_at,
                pinned=h.entry.pinned,
                media_kinds=h.client.media_kinds if h.client is not None else frozenset(),
                path=h.entry.config.model_path,
                n_ctx=h.entry.config.n_ctx,
            )
            for h in self.models()
        ]

    def stats(self) -> list[tuple[str, EngineStats]]:
        """(id, engine stats) of every model with an engine (loaded or loading)."""
        return [(h.entry.id, h.client.stats()) for h in self.models() if h.client is not None]

    def stalled_for(self) -> float:
        """The longest any engine's current step has lasted (0 between steps)."""
        return max((h.engine.stalled_for() for h in self._everyone() if h.engine), default=0.0)


def _signature(config: EngineConfig) -> tuple[int, int] | None:
    """(size, mtime in ns) of a model's file: a file replaced under the same path differs."""
    try:
        found = os.stat(config.model_path)
    except OSError:
        return None
    return found.st_size, found.st_mtime_ns
