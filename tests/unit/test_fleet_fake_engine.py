"""The fleet's policy (catalogue/fleet.py) on a scripted fake engine: loads on demand, one at a
time, within the memory budget and the count, least recently used idle models unloaded first,
never a model with a lease or a pinned one, idle unloads after the keep-alive, a failed load
confined to its model, a swap that keeps the old version serving until the new one loads. The
real engines' side (the server on Gemma 3 270M and SmolLM2) is tests/integration/test_catalogue.py.
"""

from __future__ import annotations

import asyncio
import math
from dataclasses import dataclass, field

import pytest

from edgeserve.catalogue.entries import Catalogue, ModelEntry
from edgeserve.catalogue.fleet import Fleet
from edgeserve.catalogue.footprint import Footprint
from edgeserve.catalogue.status import Status
from edgeserve.engine.types import EngineConfig
from edgeserve.errors import ModelRefused, ModelUnavailable, UnknownModel

MIB = 2**20
SIZES = {"a": 100, "b": 100, "c": 150, "p": 50, "big": 500, "bad": 10}  # MiB each


@dataclass
class FakeEngine:
    """An engine that loads when told to (`release`), or fails for a path named "bad"."""

    config: EngineConfig
    events: list[str]
    gate: asyncio.Event | None = None
    started: bool = False
    closed: bool = False
    accepting: bool = True
    load_error: str | None = None
    loaded: bool = False
    running: bool = False
    media_kinds: frozenset[str] = field(default_factory=frozenset)

    def start(self) -> None:
        self.started = self.running = True
        self.events.append(f"load {self.config.model_path}")

    def wait_loaded(self) -> bool:
        if self.config.model_path.startswith("bad"):
            self.load_error = "not a GGUF file"
            self.running = False
            return False
        self.loaded = True
        return True

    def stop_accepting(self) -> None:
        self.accepting = False

    def close(self) -> None:
        self.closed, self.running, self.loaded = True, False, False
        self.events.append(f"unload {self.config.model_path}")

    def stalled_for(self) -> float:
        return 0.0


def entry(name: str, **kw: object) -> ModelEntry:
    return ModelEntry(id=name, config=EngineConfig(model_path=name), **kw)  # type: ignore[arg-type]


def sized(config: EngineConfig) -> Footprint:
    return Footprint(
        weights=SIZES[config.model_path.split("/")[-1].split(".")[0]] * MIB, kv=0, compute=0
    )


def fleet(
    *entries: ModelEntry, budget_mib: int = 260, max_loaded: int = 4, keep_alive: float = math.inf
) -> tuple[Fleet, list[str]]:
    events: list[str] = []
    made = Fleet(
        Catalogue(list(entries)),
        memory_budget=budget_mib * MIB,
        max_loaded=max_loaded,
        keep_alive=keep_alive,
        factory=lambda config: FakeEngine(config, events),  # type: ignore[arg-type,return-value]
        estimator=sized,
    )
    return made, events


async def use(models: Fleet, name: str, keep_alive: float | None = None) -> str:
    async with models.lease(name, keep_alive) as held:
        assert held.client.engine.loaded
        return held.entry.id


def status(models: Fleet) -> dict[str, str]:
    return {h.entry.id: h.status.value for h in models.models()}


async def unloaded(models: Fleet, name: str) -> bool:
    """Whether `name` unloads within 5 s (a loaded machine may run a timer late)."""
    for _ in range(500):
        if status(models)[name] == "unloaded":
            return True
        await asyncio.sleep(0.01)
    return False


async def test_a_model_loads_on_its_first_request_and_serves_the_next_without_loading():
    models, events = fleet(entry("a"), entry("b"))
    assert status(models) == {"a": "unloaded", "b": "unloaded"}
    assert await use(models, "a") == "a"
    assert await use(models, "a") == "a"
    assert events == ["load a"]
    assert status(models) == {"a": "loaded", "b": "unloaded"}


async def test_an_unknown_name_names_the_models_there_are():
    models, _ = fleet(entry("a"), entry("b", aliases=("bee",)))
    with pytest.raises(UnknownModel) as raised:
        await use(models, "c")
    assert raised.value.available == ["a", "b"]
    assert await use(models, "bee") == "b"


async def test_the_least_recently_used_idle_model_makes_room():
    models, events = fleet(entry("a"), entry("b"), entry("c"))
    await use(models, "a")
    await use(models, "b")
    await use(models, "a")  # b is now the least recently used
    await use(models, "c")  # 100 + 100 + 150 > 260: one must go
    assert events == ["load a", "load b", "unload b", "load c"]
    assert status(models) == {"a": "loaded", "b": "unloaded", "c": "loaded"}


async def test_a_model_with_a_running_request_is_never_unloaded_to_make_room():
    models, events = fleet(entry("a"), entry("b"), entry("c"), budget_mib=210)
    async with models.lease("a"):
        await use(models, "b")  # a is busy: b fits beside it (200 <= 210)
        with pytest.raises(ModelUnavailable) as raised:
            await use(models, "c")  # b can go, but a cannot, and 100 + 150 > 210
        assert "no room" in raised.value.reason and raised.value.retry_after > 0
        assert status(models)["a"] == "loaded"
    assert await use(models, "c") == "c"  # a is idle now
    assert "unload a" in events


async def test_a_model_larger_than_the_budget_is_refused_without_unloading_anything():
    models, events = fleet(entry("a"), entry("big"))
    await use(models, "a")
    with pytest.raises(ModelUnavailable) as raised:
        await use(models, "big")
    assert "more than the models' memory budget" in raised.value.reason
    assert events == ["load a"]


async def test_pinned_models_stay_and_the_count_is_a_limit_too():
    models, events = fleet(entry("a", pinned=True), entry("b"), entry("c"), max_loaded=2,
                           budget_mib=10_000)  # fmt: skip
    await use(models, "a")
    await use(models, "b")
    await use(models, "c")  # two at most: b goes, the pinned a stays
    assert status(models) == {"a": "loaded", "b": "unloaded", "c": "loaded"}
    assert "unload a" not in events


async def test_a_failed_load_fails_its_requests_and_leaves_the_others_serving():
    models, _ = fleet(entry("a"), entry("bad"))
    await use(models, "a")
    with pytest.raises(ModelUnavailable) as raised:
        await use(models, "bad")
    assert "failed to load: not a GGUF file" in raised.value.reason
    assert status(models) == {"a": "loaded", "bad": "failed"}
    assert await use(models, "a") == "a"


async def test_requests_that_arrive_while_a_model_loads_share_its_one_load():
    models, events = fleet(entry("a"))
    assert await asyncio.gather(*(use(models, "a") for _ in range(5))) == ["a"] * 5
    assert events == ["load a"]


async def test_an_idle_model_unloads_after_its_keep_alive_and_not_while_used():
    models, events = fleet(entry("a"), entry("b", keep_alive=math.inf), keep_alive=0.05)
    await use(models, "a")
    await use(models, "b")
    held = models.held("a")
    assert held.expires_at is not None
    assert await unloaded(models, "a")
    assert status(models) == {"a": "unloaded", "b": "loaded"}
    async with models.lease("a"):
        await asyncio.sleep(0.15)  # busy past its keep-alive: stays
        assert status(models)["a"] == "loaded"
    assert await unloaded(models, "a")
    await asyncio.sleep(0.05)
    assert events.count("unload a") == 2


async def test_a_request_s_keep_alive_0_unloads_after_the_answer_and_negative_keeps():
    models, _ = fleet(entry("a"), entry("b"), keep_alive=3600)
    await use(models, "a", keep_alive=0.0)
    assert await unloaded(models, "a")
    await use(models, "b", keep_alive=math.inf)
    assert models.held("b").expires_at is None


async def test_a_removed_model_unloads_once_its_running_request_ends():
    models, events = fleet(entry("a"), entry("b"))
    async with models.lease("a"):
        models.reload(Catalogue([entry("b")]))
        await asyncio.sleep(0.01)
        assert "unload a" not in events
        with pytest.raises(UnknownModel):
            await use(models, "a")
    await asyncio.sleep(0.01)
    assert "unload a" in events


async def test_a_swap_serves_the_old_version_until_the_new_one_has_loaded(tmp_path):
    (tmp_path / "a2.gguf").write_bytes(b"GGUF")
    SIZES["a2"] = 100
    models, events = fleet(entry("a"))
    models.files_dir = str(tmp_path)
    await use(models, "a")
    old = models.held("a")
    async with models.lease("a"):
        new = await models.load("a", str(tmp_path / "a2.gguf"))
        assert models.held("a") is new and new.status is Status.LOADED
        assert old.status is Status.LOADED, "its running request still has it"
    await asyncio.sleep(0.01)
    assert old.status is Status.UNLOADED and events[-1] == "unload a"
    with pytest.raises(ModelRefused):
        await models.load("a", "/etc/passwd")


async def test_a_request_right_after_the_idle_unload_fires_gets_a_new_engine():
    # The keep-alive's timer takes the engine away at once; its memory is freed in the
    # background. A request in between must not be handed the engine being closed.
    models, events = fleet(entry("a"), keep_alive=3600)
    async with models.lease("a") as held:
        first = held.client
    models._idle_unload(models.held("a"))  # the timer firing
    async with models.lease("a") as held:
        second = held.client
        assert second is not first and second.engine.loaded
    await asyncio.sleep(0.01)
    assert first.engine.closed and not second.engine.closed
    assert sorted(events) == ["load a", "load a", "unload a"]


async def test_a_pinned_model_refuses_an_unload():
    models, _ = fleet(entry("a", pinned=True))
    await use(models, "a")
    with pytest.raises(ModelRefused, match="pinned"):
        await models.unload("a")
    assert status(models) == {"a": "loaded"}


async def test_release_unloads_once_idle_and_never_loads():
    models, events = fleet(entry("a"), entry("b"), entry("p", pinned=True), keep_alive=3600)
    models.release("a")  # not loaded: stays so, nothing loads
    await asyncio.sleep(0.05)
    assert status(models)["a"] == "unloaded" and events == []
    await use(models, "a")  # its next load keeps the usual keep-alive
    await asyncio.sleep(0.05)
    assert status(models)["a"] == "loaded"
    models.release("a")  # loaded and idle: it unloads now, not after the hour's keep-alive
    models.release("a")
    assert await unloaded(models, "a")
    await use(models, "b")
    async with models.lease("b"):
        models.release("b")  # in use: it unloads after the running request, not before
        await asyncio.sleep(0.05)
        assert status(models)["b"] == "loaded"
    assert await unloaded(models, "b")
    await use(models, "p")
    models.release("p")
    await asyncio.sleep(0.05)
    assert status(models)["p"] == "loaded"
    with pytest.raises(UnknownModel):
        models.release("nope")
