"""Ollama's model routes over a catalogue (--models-dir with the real Gemma 3 270M): models
listed unloaded without loading them, `keep_alive` on a request setting when the catalogue's
idle unload comes (/api/ps' `expires_at`), an empty request that loads, and `keep_alive: 0`
that unloads (and never loads a model to unload it); unknown names in Ollama's shape."""

from __future__ import annotations

import asyncio
import logging
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from edgeserve.catalogue.entries import build_catalogue
from edgeserve.catalogue.fleet import Fleet
from edgeserve.config import Settings
from edgeserve.http.app import create_app

pytestmark = pytest.mark.needs_model

MIB = 2**20


@pytest.fixture
async def client(aiohttp_client, tmp_path: Path, model_path: Path):
    """An app over a catalogue of one model, `gemma` (unloaded until asked for)."""
    folder = tmp_path / "models"
    folder.mkdir()
    (folder / "gemma.gguf").symlink_to(model_path)
    settings = Settings(model="", models_dir=str(folder), ctx_size=512, parallel=1)
    fleet = Fleet(
        build_catalogue(settings),
        memory_budget=4096 * MIB,
        max_loaded=settings.models_max,
        keep_alive=settings.keep_alive,
        files_dir=settings.models_dir,
    )
    yield await aiohttp_client(create_app(settings, fleet))
    await fleet.close()


async def get(client: Any, path: str) -> dict[str, Any]:
    resp = await client.get(path)
    assert resp.status == 200, await resp.text()
    return await resp.json()


async def post(client: Any, path: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    resp = await client.post(path, json=body)
    return resp.status, await resp.json()


async def status(client: Any) -> str:
    [card] = (await get(client, "/models"))["data"]
    return card["status"]["value"]


def seconds_left(entry: dict[str, Any]) -> float:
    return datetime.fromisoformat(entry["expires_at"]).timestamp() - time.time()


async def test_models_are_listed_and_shown_without_loading(client):
    [listed] = (await get(client, "/api/tags"))["models"]
    assert listed["name"] == "gemma:latest" and listed["details"]["family"] == "gemma3"
    status_code, shown = await post(client, "/api/show", {"model": "gemma"})
    assert status_code == 200 and shown["model_info"]["general.architecture"] == "gemma3"
    assert (await get(client, "/api/ps"))["models"] == []
    status_code, body = await post(client, "/api/chat", {"model": "llama3", "messages": []})
    assert (status_code, body) == (404, {"error": "model 'llama3' not found"})
    assert await status(client) == "unloaded"


async def test_keep_alive_sets_the_idle_unload_and_zero_unloads(client):
    ask = {"model": "gemma:latest", "messages": [{"role": "user", "content": "Hi"}]}
    body = {**ask, "stream": False, "options": {"num_predict": 2}, "keep_alive": "10m"}
    status_code, body = await post(client, "/api/chat", body)
    assert status_code == 200 and body["done"] and body["load_duration"] > 0  # it loaded
    [loaded] = (await get(client, "/api/ps"))["models"]
    assert loaded["name"] == "gemma:latest" and loaded["context_length"] == 512
    assert 540 < seconds_left(loaded) <= 600
    status_code, body = await post(client, "/api/generate", {"model": "gemma", "keep_alive": 30})
    assert status_code == 200 and body["done_reason"] == "load"
    [loaded] = (await get(client, "/api/ps"))["models"]
    assert 0 < seconds_left(loaded) <= 30
    status_code, body = await post(client, "/api/generate", {"model": "gemma", "keep_alive": 0})
    assert status_code == 200 and body["done_reason"] == "unload"
    for _ in range(500):
        if await status(client) == "unloaded":
            break
        await asyncio.sleep(0.01)
    assert await status(client) == "unloaded"
    assert (await get(client, "/api/ps"))["models"] == []


def loads_logged(caplog: pytest.LogCaptureFixture) -> int:
    return sum(" loaded in " in r.getMessage() for r in caplog.records)


async def test_keep_alive_zero_with_nothing_to_run_never_loads_the_model(client, caplog):
    caplog.set_level(logging.INFO, logger="edgeserve")
    for path, empty in (("/api/generate", {"prompt": ""}), ("/api/chat", {"messages": []})):
        body = {"model": "gemma", "keep_alive": 0, "stream": False, **empty}
        status_code, answer = await post(client, path, body)
        assert status_code == 200, answer
        assert (answer["done"], answer["done_reason"], answer["model"]) == (True, "unload", "gemma")
        assert await status(client) == "unloaded"
    assert loads_logged(caplog) == 0
    status_code, answer = await post(client, "/api/chat", {"model": "llama3", "keep_alive": 0})
    assert (status_code, answer) == (404, {"error": "model 'llama3' not found"})
    # With something to run, keep_alive 0 loads the model, answers, then unloads it.
    ask = {"model": "gemma", "prompt": "Hi", "stream": False, "options": {"num_predict": 2}}
    status_code, answer = await post(client, "/api/generate", {**ask, "keep_alive": 0})
    assert status_code == 200 and answer["load_duration"] > 0 and answer["done_reason"] != "unload"
    assert loads_logged(caplog) == 1
    for _ in range(500):
        if await status(client) == "unloaded":
            break
        await asyncio.sleep(0.01)
    assert await status(client) == "unloaded"
