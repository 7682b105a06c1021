"""The chat page over a catalogue, in headless Chromium: the real Gemma 3 270M and
SmolLM2-135M-Instruct, and a file that is no model, behind one server. The chooser lists every
model with its status and starts with the loaded one; choosing a model loads it (the chip says
"loading <id>" until it has), and its answers are named by it; a failed load shows its reason;
the server panel lists the models in place of one engine's figures. The page's helpers for a
catalogue are among the cases of webui_helpers.js (test_webui_browser.py)."""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
import pytest_asyncio
from aiohttp import web
from playwright.async_api import Request

from edgeserve.catalogue.entries import build_catalogue
from edgeserve.catalogue.fleet import Fleet
from edgeserve.config import Settings
from edgeserve.http.app import create_app
from tests.integration.webui_browser import SCREENSHOTS, Watched, browser, listen, watched

__all__ = ["browser", "watched"]

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.needs_model]

MIB = 2**20
ENGINE_ROWS = ("adapters", "ctx", "slots", "queue", "kv", "gpu")

# The chooser's entries: [text, value, title].
CHOICES = "el => [...el.options].map((o) => [o.text, o.value, o.title])"
# Records each text the load chip shows.
RECORD_CHIP = """() => {
  window.__chip = [];
  const text = document.getElementById('load-text');
  new MutationObserver(() => window.__chip.push(text.textContent))
    .observe(text, {childList: true, characterData: true, subtree: true});
}"""


def chip_is(text: str) -> str:
    """A page function: true once the load chip says `text`."""
    return f"() => document.getElementById('load-text').textContent === {json.dumps(text)}"


def choice_is(model: str, text: str) -> str:
    """A page function: true once the chooser's entry for `model` says `text`."""
    option = f"document.querySelector('#model-choice option[value={json.dumps(model)}]')"
    return f"() => {option}?.text === {json.dumps(text)}"


def shown_in_turn(texts: list[str]) -> list[str]:
    """`texts` without repeats in a row (a poll shows the same text again)."""
    return [text for i, text in enumerate(texts) if i == 0 or texts[i - 1] != text]


@pytest.fixture(scope="module")
def models_dir(tmp_path_factory, model_path: Path, smollm2_path: Path) -> Path:
    """gemma.gguf, smollm2.gguf, and broken.gguf (not a GGUF file)."""
    folder = tmp_path_factory.mktemp("webui-catalogue")
    (folder / "gemma.gguf").symlink_to(model_path)
    (folder / "smollm2.gguf").symlink_to(smollm2_path)
    (folder / "broken.gguf").write_bytes(b"not a model")
    return folder


@pytest_asyncio.fixture(loop_scope="module")
async def catalogue(models_dir: Path) -> AsyncIterator[tuple[str, Fleet]]:
    """An app on a real port over a fleet of `models_dir` (nothing loaded, room for both
    models): the page's URL and the fleet, whose models unload after the test."""
    settings = Settings(
        model="", models_dir=str(models_dir), ctx_size=512, parallel=1, models_memory=2048 * MIB
    )
    fleet = Fleet(
        build_catalogue(settings),
        memory_budget=2048 * MIB,  # as the server gives it --models-memory
        max_loaded=settings.models_max,
        keep_alive=settings.keep_alive,
        files_dir=settings.models_dir,
    )
    runners: list[web.AppRunner] = []
    try:
        yield await listen(create_app(settings, fleet), runners), fleet
    finally:
        for runner in runners:
            await runner.cleanup()
        await fleet.close()


async def engine_steps(page) -> dict[str, float]:
    """Each model's `edgeserve_engine_steps_total` from the page's /metrics."""
    text = await page.evaluate("() => fetch('metrics').then((r) => r.text())")
    found = re.findall(r'^edgeserve_engine_steps_total\{model="([^"]+)"\} (\S+)$', text, re.M)
    return {model: float(value) for model, value in found}


async def test_the_chooser_lists_the_catalogue_and_loads_the_model_chosen(
    catalogue: tuple[str, Fleet], watched: Watched
):
    url, fleet = catalogue
    page = watched.page
    await fleet.load("gemma")  # loaded before the page opens: the page starts with it
    loads: list[object] = []  # the bodies of the page's POST /models/load

    def seen(request: Request) -> None:
        if request.url.endswith("/models/load"):
            loads.append(request.post_data_json)

    page.on("request", seen)
    await watched.open(url)
    chooser = page.locator("#model-choice")
    await chooser.wait_for()
    assert await page.is_hidden("#model-name")
    assert await chooser.evaluate(CHOICES) == [
        ["broken — unloaded", "broken", ""],
        ["gemma — loaded", "gemma", ""],
        ["smollm2 — unloaded", "smollm2", ""],
    ]
    assert await chooser.input_value() == "gemma"
    await page.wait_for_function(chip_is("loaded"))
    # The server panel: the models and their status, no engine figures, no "–".
    models = page.locator("#info-models")
    assert await models.inner_text() == "broken — unloaded\ngemma — loaded\nsmollm2 — unloaded"
    assert await page.inner_text("#info-model") == "gemma"
    assert await page.inner_text("#info-input") == "text"
    for row in ENGINE_ROWS:
        assert await page.is_hidden(f"#info-{row}")
    assert "–" not in await page.inner_text("#server-info")
    assert await page.is_hidden("#model-problem")

    await page.evaluate(RECORD_CHIP)
    await chooser.select_option("smollm2")
    await page.wait_for_function(choice_is("smollm2", "smollm2 — loaded"), timeout=60_000)
    await page.wait_for_function(chip_is("loaded"))
    shown = shown_in_turn(await page.evaluate("window.__chip"))
    assert shown[shown.index("loading smollm2") :] == ["loading smollm2", "loaded"], shown
    assert loads == [{"model": "smollm2"}]
    assert await models.inner_text() == "broken — unloaded\ngemma — loaded\nsmollm2 — loaded"
    assert await page.evaluate("() => localStorage.getItem('edgeserve.model')") == "smollm2"

    await page.fill("#temperature", "0")
    before = await engine_steps(page)
    await watched.ask("Say hello.", max_tokens=4)
    answer = await watched.answered(1)
    assert watched.chat_body()["model"] == "smollm2"
    assert await answer.locator(".who").inner_text() == "smollm2"
    assert 1 <= int(await watched.figure(answer, "completion")) <= 4
    after = await engine_steps(page)
    # SmolLM2's engine decoded the answer, Gemma's did not (the streamed body itself is not
    # readable through Playwright once the page has consumed it).
    assert after["smollm2"] > before["smollm2"] and after["gemma"] == before["gemma"]
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    await page.screenshot(path=SCREENSHOTS / "webui-laptop-catalogue.png")

    await chooser.select_option("broken")
    await page.wait_for_function(chip_is("broken failed"), timeout=60_000)
    async with aiohttp.ClientSession() as http, http.get(url + "models") as resp:
        cards = {card["id"]: card for card in (await resp.json())["data"]}
    reason = cards["broken"]["status"]["reason"]
    assert reason
    assert await page.get_attribute("#load-chip", "data-state") == "down"
    problem = await page.inner_text("#model-problem")
    assert reason in problem and "broken" in problem, problem
    await page.wait_for_function(choice_is("broken", "broken — failed"))
    assert (await chooser.evaluate(CHOICES))[0] == ["broken — failed", "broken", reason]
    assert "broken — failed" in await models.inner_text()

    await chooser.select_option("gemma")  # loaded: nothing to load, the failure is gone
    await page.wait_for_function(chip_is("loaded"))
    assert await page.is_hidden("#model-problem")
    assert loads == [{"model": "smollm2"}, {"model": "broken"}]
    assert [e for e in watched.errors if "status of 503" not in e] == [], watched.errors
