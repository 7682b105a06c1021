"""The chat page at `/` in headless Chromium, against the real server and the default model:
a clean load, a streamed answer with its figures and copy button, the conversation kept and
cleared, Stop, markup that stays text, a refused request, the API key, an attached image, the
adapter chooser (LoRA adapters the tests write), and the page's pure helpers. The run saves
screenshots of a finished exchange, at laptop and phone width, and of the chooser in
build/screenshots/."""

from __future__ import annotations

import asyncio
import base64
import re
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest

from edgeserve.engine.worker import Engine
from tests.conftest import running_engine
from tests.fixtures.tiny_lora import write_lora
from tests.integration.engine_idle import assert_engine_idle, assert_left_work_stops
from tests.integration.vision import image_bytes
from tests.integration.webui_browser import (
    PHONE,
    SCREENSHOTS,
    Watched,
    ban_end_of_generation,
    browser,
    serve,
    watched,
)

__all__ = ["browser", "serve", "watched"]

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.needs_model]

PAYLOAD = "<img src=x onerror=alert(1)><script>alert(2)</script>"
BASE = "gemma-test"
ADAPTERS = ("support", "sql")
CHOICE_ITEM = "edgeserve.model"

# The chooser's entries: [group label, text, value].
CHOICES = "el => [...el.options].map((o) => [o.parentElement.label, o.textContent, o.value])"
# What the page keeps in localStorage.
STORED = "() => ({...localStorage})"
# The page's health poll, now (it lists the models again): as when the tab comes back.
POLL = "() => document.dispatchEvent(new Event('visibilitychange'))"

# Records the length of the newest answer's text at each change the page makes to it.
RECORD_GROWTH = """() => {
  window.__lengths = [];
  new MutationObserver(() => {
    const answers = document.querySelectorAll('.msg.assistant .text');
    const last = answers[answers.length - 1];
    if (last) window.__lengths.push(last.textContent.length);
  }).observe(document.getElementById('log'), {childList: true, subtree: true, characterData: true});
}"""


# Whether the newest answer's footer (copy button) is inside the conversation's visible area.
LAST_ANSWER_IN_VIEW = """() => {
  const log = document.getElementById('log').getBoundingClientRect();
  const copy = [...document.querySelectorAll('.msg.assistant .copy')].pop().getBoundingClientRect();
  return copy.top >= log.top && copy.bottom <= log.bottom;
}"""


@pytest.fixture(scope="module")
def adapter_files(tmp_path_factory, model_path) -> dict[str, Path]:
    """Two tiny adapters for the default model (tests/fixtures/tiny_lora.py), and a third that
    is loaded and unloaded at run time."""
    folder = tmp_path_factory.mktemp("webui-lora")
    names = (*ADAPTERS, "retired")
    return {
        name: write_lora(folder / f"{name}.gguf", model_path, seed=seed)
        for seed, name in enumerate(names, 1)
    }


@pytest.fixture(scope="module")
def lora_engine(model_path, adapter_files) -> Iterator[Engine]:
    """The default model with `support` and `sql` (as `--lora support=… --lora sql=…`)."""
    adapters = tuple((name, str(adapter_files[name])) for name in ADAPTERS)
    with running_engine(model_path, parallel=2, lora_adapters=adapters) as engine:
        yield engine


async def serve_adapters(serve, lora_engine, adapter_files) -> str:
    lora = tuple((name, str(adapter_files[name])) for name in ADAPTERS)
    return await serve(engine_=lora_engine, lora=lora, allow_runtime_lora=True)


def settings_drawer(shown: bool) -> str:
    """A page function: true once the settings drawer has slid fully in or out of view."""
    where = "right <= innerWidth + 0.5" if shown else "left >= innerWidth"
    return f"() => document.getElementById('settings').getBoundingClientRect().{where}"


async def test_page_loads_clean_from_its_own_origin(serve, watched: Watched):
    url = await serve()
    await watched.open(url)
    page = watched.page
    assert await page.inner_text("#model-name") == "gemma-test"
    await page.wait_for_function(
        "() => document.getElementById('load-text').textContent === 'idle'"
    )
    assert await page.inner_text("#info-ctx") == "2,048 tokens"
    assert await page.inner_text("#info-input") == "text"
    assert await page.is_hidden("#attach")  # no --mmproj: no images to attach
    assert await page.is_hidden("#model-choice")  # no adapters: no chooser, the name alone
    assert await page.is_visible("#model-name")
    assert await page.inner_text("#info-adapters") == "none"
    assert await page.is_hidden("#key-dialog")
    assert not watched.errors
    origin = url.rstrip("/")
    assert all(seen.startswith(origin + "/") for seen in watched.urls), watched.urls
    assert {url, url + "v1/models", url + "health", url + "webui/app.js"} <= set(watched.urls)


async def test_an_answer_streams_in_with_its_figures(serve, watched: Watched):
    page = watched.page
    await watched.open(await serve())
    await ban_end_of_generation(page)
    await page.evaluate(RECORD_GROWTH)
    await page.fill("#system", "You are a friendly assistant.")
    await page.fill("#seed", "7")
    await watched.ask("Write a short poem about a small server.", max_tokens=32)
    answer = await watched.answered(1)

    lengths = await page.evaluate("window.__lengths")
    growing = sorted(set(lengths))
    assert len(growing) >= 3, f"the answer did not grow over several frames: {lengths}"
    assert lengths == sorted(lengths)
    assert re.fullmatch(r"\d+ ms|\d+\.\d\d s", await watched.figure(answer, "ttft"))
    assert re.fullmatch(r"\d+(\.\d)? tok/s", await watched.figure(answer, "rate"))
    assert await watched.figure(answer, "completion") == "32"
    assert int(await watched.figure(answer, "prompt")) > 10
    assert await watched.figure(answer, "note") == "max tokens reached"
    body = watched.chat_body()
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    assert (body["max_tokens"], body["seed"], body["temperature"]) == (32, 7, 0.7)
    assert body["model"] == BASE
    assert await answer.locator(".who").inner_text() == BASE
    assert body["messages"] == [
        {"role": "system", "content": "You are a friendly assistant."},
        {"role": "user", "content": "Write a short poem about a small server."},
    ]

    await answer.locator(".copy").click()
    await answer.locator(".copy-label", has_text="Copied").wait_for()
    copied = await page.evaluate("() => navigator.clipboard.readText()")
    assert copied == await answer.locator(".text").text_content()

    await watched.ask("Now make it rhyme.", max_tokens=8)
    second = await watched.answered(2)
    assert int(await watched.figure(second, "cached")) > 0  # the first turn, from the cache
    assert not watched.errors
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    await page.screenshot(path=SCREENSHOTS / "webui-laptop.png")
    await page.emulate_media(color_scheme="dark")
    await page.set_viewport_size(PHONE)
    await page.wait_for_function(settings_drawer(False))  # slid out of view
    await watched.ask("Thank you!", max_tokens=4)
    await watched.answered(3)
    assert await page.evaluate(LAST_ANSWER_IN_VIEW)  # the page followed the answer down
    await page.screenshot(path=SCREENSHOTS / "webui-phone-dark.png")
    await page.click("#settings-toggle")
    await page.wait_for_function(settings_drawer(True))
    await page.screenshot(path=SCREENSHOTS / "webui-phone-settings.png")


async def test_the_conversation_is_kept_and_cleared(serve, watched: Watched):
    page = watched.page
    await watched.open(await serve())
    await watched.ask("Hello there.", max_tokens=3)
    first = await (await watched.answered(1)).locator(".text").text_content()
    await watched.ask("Tell me more.", max_tokens=3)
    await watched.answered(2)
    assert watched.chat_body()["messages"] == [
        {"role": "user", "content": "Hello there."},
        {"role": "assistant", "content": first},
        {"role": "user", "content": "Tell me more."},
    ]
    await page.click("#clear")
    assert await page.locator(".msg").count() == 0
    await watched.ask("Start again.", max_tokens=2)
    await watched.answered(1)
    assert watched.chat_body()["messages"] == [{"role": "user", "content": "Start again."}]


async def test_stop_ends_the_answer_and_the_engine_goes_idle(serve, watched: Watched, engine):
    page = watched.page
    await watched.open(await serve())
    await ban_end_of_generation(page)
    await watched.ask("Write a very long story.", max_tokens=400)
    text = page.locator(".msg.assistant .text")
    await page.wait_for_function(
        "() => document.querySelector('.msg.assistant .text').textContent.length > 20",
        timeout=60_000,
    )
    assert engine.stats().busy_slots == 1
    assert await page.is_visible("#stop")
    left_at = engine.stats().engine_steps
    await page.evaluate("() => document.getElementById('stop').click()")  # one round trip
    await assert_left_work_stops(engine, left_at)
    await assert_engine_idle(engine)
    answer = await watched.answered(1)
    assert await watched.figure(answer, "note") == "stopped"
    assert await answer.locator('.fig[data-fig="completion"]').count() == 0
    assert await page.is_visible("#send") and await page.is_hidden("#stop")
    shown = await text.inner_text()
    await asyncio.sleep(0.3)
    assert await text.inner_text() == shown
    assert not watched.errors


async def test_markup_from_the_user_and_the_model_stays_text(serve, watched: Watched):
    """The user's message is the markup itself, and so is the system prompt, which the default
    (base) model echoes greedily: its answer, generated and streamed as any other, starts with
    the same markup (checked, so the test cannot pass on an answer without it)."""
    page = watched.page
    dialogs: list[str] = []
    page.on("dialog", lambda dialog: dialogs.append(dialog.message))
    await watched.open(await serve())
    await page.fill("#system", PAYLOAD)
    await page.fill("#temperature", "0")
    await watched.ask(PAYLOAD, max_tokens=24)
    answer = await watched.answered(1)
    assert await page.inner_text(".msg.user .text") == PAYLOAD
    assert (await answer.locator(".text").text_content()).startswith(PAYLOAD)
    assert await page.locator("#log img, #log script").count() == 0
    assert not dialogs  # no alert() ran
    assert not any(url.endswith("/x") for url in watched.urls)
    assert not watched.errors


async def test_the_page_asks_for_the_api_key_and_shows_the_servers_error(serve, watched: Watched):
    page = watched.page
    url = await serve(api_keys=("sekret",))
    await page.goto(url)
    await page.wait_for_selector("#key-dialog:not([hidden])")
    await page.fill("#key-input", "wrong")
    await page.press("#key-input", "Enter")
    await page.wait_for_selector("#key-error:not([hidden])")
    assert await page.inner_text("#key-error") == "Invalid API key."
    await page.fill("#key-input", "sekret")
    await page.press("#key-input", "Enter")
    await page.wait_for_selector("#key-dialog", state="hidden")
    assert await page.inner_text("#model-name") == "gemma-test"
    await watched.ask("Hi.", max_tokens=2)
    await watched.answered(1)
    assert await watched.chats[-1].header_value("authorization") == "Bearer sekret"
    stored = await page.evaluate("[{...sessionStorage}, localStorage.length]")
    assert stored == [{"edgeserve.api-key": "sekret"}, 0]
    await page.reload()
    await page.wait_for_function(
        "() => document.getElementById('model-name').textContent === 'gemma-test'"
    )
    assert await page.is_hidden("#key-dialog")
    unauthorized = [e for e in watched.errors if "status of 401" in e]
    assert unauthorized and len(unauthorized) == len(watched.errors), watched.errors


async def test_a_refused_request_shows_the_servers_error(serve, watched: Watched):
    page = watched.page
    await watched.open(await serve())
    await watched.ask("Hello.", max_tokens=0)
    error = page.locator(".msg.assistant .error")
    await error.wait_for()
    assert await error.inner_text() == '"max_tokens" must be at least 1, got 0.'
    assert await page.locator(".msg.user.dropped").count() == 1  # not in the conversation
    assert await page.input_value("#prompt") == "Hello."  # back in the box, to send again
    assert [e for e in watched.errors if "status of 400" not in e] == []


async def test_an_image_is_attached_when_the_model_takes_images(
    serve, watched: Watched, vision_engine
):
    page = watched.page
    await watched.open(await serve(engine_=vision_engine))
    await page.wait_for_selector("#attach:not([hidden])")
    png = image_bytes(seed=3)
    picked = {"name": "a.png", "mimeType": "image/png", "buffer": png}
    await page.set_input_files("#file", files=[picked])
    await page.wait_for_selector("#attachments .chip img")
    await watched.ask("What is in this picture?", max_tokens=3)
    await watched.answered(1)
    data_url = "data:image/png;base64," + base64.b64encode(png).decode()
    content = watched.chat_body()["messages"][-1]["content"]
    assert content == [
        {"type": "text", "text": "What is in this picture?"},
        {"type": "image_url", "image_url": {"url": data_url}},
    ]
    assert await page.get_attribute(".msg.user .images img", "src") == data_url
    assert await page.is_hidden("#attachments")
    assert not watched.errors


async def test_the_adapter_chooser_picks_who_answers_and_is_kept(
    serve, watched: Watched, lora_engine, adapter_files
):
    page = watched.page
    url = await serve_adapters(serve, lora_engine, adapter_files)
    await watched.open(url)
    chooser = page.locator("#model-choice")
    await chooser.wait_for()
    assert await page.is_hidden("#model-name")
    assert await chooser.evaluate(CHOICES) == [
        ["Base model", BASE, BASE],
        ["LoRA adapters", "support", "support"],
        ["LoRA adapters", "sql", "sql"],
    ]
    assert await chooser.input_value() == BASE
    assert await page.inner_text("#info-adapters") == "support, sql"
    assert await page.evaluate(STORED) == {}

    await chooser.select_option("support")
    await watched.ask("Hello.", max_tokens=4)
    first = await watched.answered(1)
    assert watched.chat_body()["model"] == "support"
    assert await first.locator(".who").inner_text() == "support"
    await chooser.select_option("sql")
    await watched.ask("And you?", max_tokens=4)
    second = await watched.answered(2)
    assert watched.chat_body()["model"] == "sql"
    assert await second.locator(".who").inner_text() == "sql"
    assert await first.locator(".who").inner_text() == "support"  # each keeps its writer
    assert await page.evaluate(STORED) == {CHOICE_ITEM: "sql"}

    await watched.open(url)  # a reload keeps the choice
    assert await chooser.input_value() == "sql"
    await watched.ask("Hi again.", max_tokens=4)
    again = await watched.answered(1)
    assert watched.chat_body()["model"] == "sql"
    assert await again.locator(".who").inner_text() == "sql"
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    await page.screenshot(path=SCREENSHOTS / "webui-laptop-adapters.png")
    await page.emulate_media(color_scheme="dark")
    await page.set_viewport_size(PHONE)
    await page.wait_for_function(settings_drawer(False))  # slid out of view
    await page.screenshot(path=SCREENSHOTS / "webui-phone-dark-adapters.png")

    await chooser.select_option(BASE)
    await watched.ask("Bye.", max_tokens=4)
    last = await watched.answered(2)
    assert watched.chat_body()["model"] == BASE
    assert await last.locator(".who").inner_text() == BASE
    assert await page.evaluate(STORED) == {}  # nothing kept for the base
    assert not watched.errors


async def test_an_adapter_no_longer_listed_falls_back_to_the_base(
    serve, watched: Watched, lora_engine, adapter_files
):
    """An adapter loaded at run time shows up at the page's next poll; once unloaded, a
    reload (and the next poll, without one) goes back to the base model."""
    page = watched.page
    url = await serve_adapters(serve, lora_engine, adapter_files)
    chooser = page.locator("#model-choice")
    retired = {"lora_name": "retired", "lora_path": str(adapter_files["retired"])}

    async with aiohttp.ClientSession(url) as http:

        async def lora(action: str, body: dict[str, str]) -> None:
            async with http.post(f"/v1/{action}_lora_adapter", json=body) as resp:
                assert resp.status == 200, await resp.text()

        async def listed(name: str) -> None:
            await page.evaluate(POLL)
            await chooser.locator(f'option[value="{name}"]').wait_for(state="attached")

        await watched.open(url)
        try:
            await lora("load", retired)
            await listed("retired")
            await chooser.select_option("retired")
            await watched.ask("Hello.", max_tokens=2)
            await watched.answered(1)
            assert watched.chat_body()["model"] == "retired"
            assert await page.evaluate(STORED) == {CHOICE_ITEM: "retired"}
        finally:
            await lora("unload", {"lora_name": "retired"})

        await watched.open(url)  # reloaded: the kept adapter is gone
        assert await chooser.input_value() == BASE
        assert [value for _, _, value in await chooser.evaluate(CHOICES)] == [BASE, *ADAPTERS]
        assert await page.evaluate(STORED) == {}

        await lora("load", retired)
        await listed("retired")
        await chooser.select_option("retired")
        await lora("unload", {"lora_name": "retired"})
        await page.evaluate(POLL)  # no reload: the next poll
        await page.wait_for_function(
            f"() => document.getElementById('model-choice').value === '{BASE}'"
        )
        await watched.ask("Hello.", max_tokens=2)
        answer = await watched.answered(1)
        assert watched.chat_body()["model"] == BASE
        assert await answer.locator(".who").inner_text() == BASE
        assert await page.evaluate(STORED) == {}
    assert not watched.errors


HELPER_CASES = (Path(__file__).parent / "webui_helpers.js").read_text()
# Each case of the list webui_helpers.js returns opens a line, indented by four spaces.
HELPER_CASE_COUNT = len(re.findall(r"^ {4}\[", HELPER_CASES, re.MULTILINE))


async def test_the_pages_helpers(serve, watched: Watched):
    await watched.open(await serve())
    cases = await watched.page.evaluate(HELPER_CASES)
    assert HELPER_CASE_COUNT > 10 and len(cases) == HELPER_CASE_COUNT, cases
    for got, expected in cases:
        assert got == expected
