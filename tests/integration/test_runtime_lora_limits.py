"""What POST /v1/load_lora_adapter may load, on the real default model with adapters the tests
write (tests/fixtures/tiny_lora.py): files of the LoRA folder only (symlinks resolved), never
under the model's name, each file once, at most --max-loras adapters, and errors that name the
path sent, never the file's bytes or llama.cpp's complaint. Then the settings end to end in a
real `edgeserve serve` process (--lora-dir, --max-loras)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest

from edgeserve.api.reference.detail import Detail
from edgeserve.config import Settings
from edgeserve.engine.client import EngineClient
from edgeserve.engine.worker import Engine
from edgeserve.http.app import create_app
from tests.conftest import running_engine
from tests.fixtures.tiny_lora import write_bad_loras, write_lora
from tests.integration.test_server_process import Server

LOAD = "/v1/load_lora_adapter"
UNLOAD = "/v1/unload_lora_adapter"
BASE = "gemma-test"
STARTUP = ("alpha", "beta")
EXTRA = 7  # adapter files besides STARTUP's: the default --max-loras (8) is one short of all
PROMPT = "The capital of France is"
SECRET = b"SECRET-API-KEY=hunter2\n"


@pytest.fixture(scope="module")
def files(tmp_path_factory, model_path) -> dict[str, Path]:
    """adapters/: the --lora files, EXTRA more, a file that is no GGUF (SECRET), llama.cpp's
    refusals, symlinks to alpha.gguf and out of the folder; outside/: a sound adapter."""
    root = tmp_path_factory.mktemp("runtime-lora").resolve()
    inside, outside = root / "adapters", root / "outside"
    inside.mkdir()
    outside.mkdir()
    names = (*STARTUP, *(f"extra{i}" for i in range(EXTRA)))
    found = {
        name: write_lora(inside / f"{name}.gguf", model_path, seed=seed)
        for seed, name in enumerate(names, 1)
    }
    found["outside"] = write_lora(outside / "other.gguf", model_path, seed=99)
    found["notes"] = inside / "notes.gguf"
    found["notes"].write_bytes(SECRET * 100)
    found |= write_bad_loras(inside, model_path)
    found["link-alpha"] = inside / "link-alpha.gguf"
    found["link-alpha"].symlink_to(found["alpha"])
    found["link-out"] = inside / "link-out.gguf"
    found["link-out"].symlink_to(found["outside"])
    return found


@pytest.fixture(scope="module")
def lora_engine(model_path, files) -> Iterator[Engine]:
    """The model with alpha and beta as --lora: the LoRA folder is theirs, adapters/."""
    startup = tuple((name, str(files[name])) for name in STARTUP)
    with running_engine(model_path, parallel=2, draft_max=0, lora_adapters=startup) as engine:
        yield engine


@pytest.fixture
async def client(aiohttp_client, lora_engine, model_path, files):
    """The server over lora_engine; whatever a test loaded is unloaded after it."""
    settings = Settings(
        model=str(model_path),
        model_name=BASE,
        lora=tuple((name, str(files[name])) for name in STARTUP),
        allow_runtime_lora=True,
        draft_max=0,
    )
    yield await aiohttp_client(create_app(settings, EngineClient(lora_engine)))
    for adapter in lora_engine.adapters.listed():
        if adapter.name not in STARTUP:
            lora_engine.unload_adapter(adapter.name).result(10)


async def load(client, name: str, path: str | Path) -> tuple[int, str | None]:
    """The status and `detail` (None for a loaded adapter's card) of a load."""
    resp = await client.post(LOAD, json={"lora_name": name, "lora_path": str(path)})
    return resp.status, (await resp.json()).get("detail")


async def listed(client) -> list[str]:
    resp = await client.get("/v1/models")
    return [card["id"] for card in (await resp.json())["data"]]


async def answer(client, model: str) -> str:
    body = {"model": model, "prompt": PROMPT, "max_tokens": 8, "temperature": 0}
    resp = await client.post("/v1/completions", json=body)
    assert resp.status == 200, await resp.text()
    return (await resp.json())["choices"][0]["text"]


async def test_the_models_own_name_is_refused_and_requests_for_it_stay_on_the_base(client, files):
    base = await answer(client, BASE)
    assert await answer(client, "alpha") != base  # an adapter would change this answer
    status, detail = await load(client, BASE, files["extra0"])
    assert (status, detail) == (400, Detail.LORA_NAME_SERVED.format(name=BASE))
    assert await listed(client) == [BASE, *STARTUP]
    assert await answer(client, BASE) == base


@pytest.mark.parametrize(
    "sent",
    [
        "{outside}",  # a sound adapter, outside
        "../outside/other.gguf",
        "{alpha}/../../outside/other.gguf",
        "{link-out}",  # a symlink in the folder to a file outside it
        "{model}",
        "/etc/passwd",
        "/nonexistent/adapter.gguf",  # refused alike: no probing which paths exist
        "alpha.gguf\0",
    ],
)
async def test_paths_whose_real_path_leaves_the_folder_are_refused(client, files, model_path, sent):
    path = sent.format(**files, model=model_path)
    status, detail = await load(client, "escaped", path)
    assert (status, detail) == (400, Detail.LORA_OUTSIDE_FOLDER.format(path=path))
    assert await listed(client) == [BASE, *STARTUP]


@pytest.mark.parametrize(
    ("case", "detail"),
    [
        ("notes", Detail.LORA_NOT_AN_ADAPTER),
        ("wrong_shape", Detail.LORA_NOT_AN_ADAPTER),
        ("other_arch", Detail.LORA_NOT_AN_ADAPTER),
        ("not_adapter", Detail.LORA_NOT_AN_ADAPTER),
        ("unknown_tensor", Detail.LORA_NOT_AN_ADAPTER),
        ("missing", Detail.LORA_NOT_A_FILE),
    ],
)
async def test_a_file_of_the_folder_that_is_no_adapter_gets_a_fixed_message(
    client, files, case, detail
):
    path = str(files.get(case, files["alpha"].parent / "missing.gguf"))
    resp = await client.post(LOAD, json={"lora_name": case, "lora_path": path})
    assert (resp.status, (await resp.json())["detail"]) == (400, detail.format(path=path))
    assert "SECR" not in await resp.text()
    assert await listed(client) == [BASE, *STARTUP]


async def test_a_file_loads_once_whatever_name_or_path_names_it(client, files):
    folder = files["alpha"].parent
    for sent in (str(files["link-alpha"]), f"{folder}/./alpha.gguf", "alpha.gguf"):
        status, detail = await load(client, "alpha-copy", sent)
        expected = Detail.LORA_FILE_LOADED.format(path=sent, loaded_as="alpha")
        assert (status, detail) == (409, expected)
    status, detail = await load(client, "gamma", "extra0.gguf")  # relative to the folder
    assert status == 200, detail
    status, detail = await load(client, "gamma-copy", files["extra0"])
    expected = Detail.LORA_FILE_LOADED.format(path=files["extra0"], loaded_as="gamma")
    assert (status, detail) == (409, expected)
    assert await listed(client) == [BASE, *STARTUP, "gamma"]
    assert await answer(client, "gamma-copy") == await answer(client, BASE)


async def test_at_most_max_loras_adapters_are_loaded(client, files):
    for i in range(EXTRA - 1):
        status, detail = await load(client, f"extra{i}", files[f"extra{i}"])
        assert status == 200, detail
    last = f"extra{EXTRA - 1}"
    status, detail = await load(client, last, files[last])
    assert (status, detail) == (409, Detail.LORA_FULL.format(limit=8))
    assert len(await listed(client)) == 1 + 8
    assert await answer(client, last) == await answer(client, BASE)
    unloaded = await client.post(UNLOAD, json={"lora_name": "extra0"})
    assert unloaded.status == 200
    status, detail = await load(client, last, files[last])
    assert status == 200, detail


async def test_without_a_folder_every_path_is_refused(aiohttp_client, engine, model_path, files):
    """The shared engine has no --lora and no --lora-dir."""
    settings = Settings(model=str(model_path), model_name=BASE, allow_runtime_lora=True)
    client = await aiohttp_client(create_app(settings, EngineClient(engine)))
    try:
        for path in (files["alpha"], files["outside"]):
            status, detail = await load(client, "nowhere", path)
            assert (status, detail) == (400, Detail.LORA_NO_FOLDER.format(path=path))
        assert await listed(client) == [BASE]
    finally:
        if engine.adapters.named("nowhere") is not None:
            engine.unload_adapter("nowhere").result(10)


async def test_lora_dir_and_max_loras_in_a_real_server(tmp_path, model_path, files):
    chosen = tmp_path / "chosen"
    chosen.mkdir()
    write_lora(chosen / "delta.gguf", model_path, seed=7)
    write_lora(chosen / "epsilon.gguf", model_path, seed=8)
    server = Server(
        model_path,
        *("--lora", f"alpha={files['alpha']}", "--lora-dir", str(chosen), "--max-loras", "2"),
        *("--allow-runtime-lora", "--api-key", "k", "--log-level", "warning"),
    )
    key = {"Authorization": "Bearer k"}
    try:
        async with aiohttp.ClientSession(headers=key) as session:
            await server.wait_ready(session)

            async def load_(name: str, path: str) -> tuple[int, dict]:
                body = {"lora_name": name, "lora_path": path}
                async with session.post(f"{server.url}{LOAD}", json=body) as resp:
                    return resp.status, await resp.json()

            beta = str(files["beta"])  # in the --lora folder, which --lora-dir replaces
            outside = Detail.LORA_OUTSIDE_FOLDER.format(path=beta)
            assert await load_("beta", beta) == (400, {"detail": outside, "message": outside})
            status, _ = await load_("delta", "delta.gguf")
            assert status == 200
            full = Detail.LORA_FULL.format(limit=2)
            refused = (409, {"detail": full, "message": full})
            assert await load_("epsilon", "epsilon.gguf") == refused
            async with aiohttp.ClientSession() as anonymous:
                body = {"lora_name": "e", "lora_path": "epsilon.gguf"}
                async with anonymous.post(f"{server.url}{LOAD}", json=body) as resp:
                    assert resp.status == 401
    finally:
        code, err = server.stop()
    assert code == 0, err
