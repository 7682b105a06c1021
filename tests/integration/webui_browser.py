"""What the chat page's browser tests share: headless Debian Chromium driven by Playwright (the
system browser, never one Playwright downloads), a page that records its console, errors and
requests, and servers on real ports around the session's engines."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest_asyncio
from aiohttp import web
from playwright.async_api import Browser, ConsoleMessage, Page, Request, Route, async_playwright

from edgeserve.engine.client import EngineClient
from edgeserve.http.app import create_app
from tests.integration.conftest import EOS_BAN, server_settings
from tests.system_tools import require

REPO = Path(__file__).resolve().parents[2]
SCREENSHOTS = REPO / "build" / "screenshots"
LAPTOP = {"width": 1280, "height": 800}
PHONE = {"width": 390, "height": 800}
CHAT = "v1/chat/completions"


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def browser() -> AsyncIterator[Browser]:
    """One headless Chromium for the module."""
    executable = require("chromium", "chromium")  # Debian's, never a download
    async with async_playwright() as playwright:
        launched = await playwright.chromium.launch(executable_path=executable)
        yield launched
        await launched.close()


Serve = Callable[..., Awaitable[str]]


async def listen(app: web.Application, runners: list[web.AppRunner]) -> str:
    """Run `app` on a real port as `edgeserve serve` runs it (handlers are cancelled when
    their client goes away), its runner added to `runners` (the caller cleans them up).
    Returns the page's URL."""
    runner = web.AppRunner(app, handler_cancellation=True)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    runners.append(runner)
    return f"http://127.0.0.1:{runner.addresses[0][1]}/"


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def serve(engine: Any, model_path: Path) -> AsyncIterator[Serve]:
    """Start an app on a real port (`listen`) around the session's engine, or `engine=`; pass
    Settings overrides as keywords. Returns the page's URL."""
    runners: list[web.AppRunner] = []

    async def start(*, engine_: Any = engine, **overrides: Any) -> str:
        app = create_app(server_settings(model_path, **overrides), EngineClient(engine_))
        return await listen(app, runners)

    yield start
    for runner in runners:
        await runner.cleanup()


@dataclass
class Watched:
    """A page and what it did: console errors, uncaught errors, every request's URL, and the
    chat requests' bodies and headers."""

    page: Page
    errors: list[str] = field(default_factory=list)
    urls: list[str] = field(default_factory=list)
    chats: list[Request] = field(default_factory=list)

    def watch(self) -> None:
        self.page.on("console", self._console)
        self.page.on("pageerror", lambda exc: self.errors.append(f"uncaught: {exc}"))
        self.page.on("request", self._request)

    def _console(self, message: ConsoleMessage) -> None:
        if message.type in ("error", "warning"):
            self.errors.append(f"{message.type}: {message.text}")

    def _request(self, request: Request) -> None:
        self.urls.append(request.url)
        if request.url.endswith(CHAT):
            self.chats.append(request)

    def chat_body(self, index: int = -1) -> dict[str, Any]:
        body = self.chats[index].post_data_json
        assert isinstance(body, dict)
        return body

    async def open(self, url: str) -> None:
        """Load the page and wait until it has the model's name from the API."""
        await self.page.goto(url)
        await self.page.wait_for_function(
            "() => document.getElementById('model-name').textContent !== 'connecting…'"
        )

    async def ask(self, text: str, max_tokens: int) -> None:
        """Type a message and send it with Enter."""
        await self.page.fill("#max-tokens", str(max_tokens))
        await self.page.fill("#prompt", text)
        await self.page.press("#prompt", "Enter")

    async def answered(self, count: int) -> Any:
        """The `count`-th answer once it has ended with its figures (not with an error)."""
        answer = self.page.locator(".msg.assistant").nth(count - 1)
        await answer.locator(".fig, .error").first.wait_for(timeout=60_000)
        error = answer.locator(".error")
        assert not await error.count(), await error.inner_text()
        return answer

    async def figure(self, answer: Any, name: str) -> str:
        return await answer.locator(f'.fig[data-fig="{name}"] .fig-value').inner_text(timeout=1000)


@pytest_asyncio.fixture(loop_scope="module")
async def watched(browser: Browser) -> AsyncIterator[Watched]:
    """A fresh browser context (its own storage) at laptop width, watched."""
    context = await browser.new_context(viewport=LAPTOP)
    await context.grant_permissions(["clipboard-read", "clipboard-write"])
    context.set_default_timeout(10_000)
    page = Watched(await context.new_page())
    page.watch()
    yield page
    await context.close()


async def ban_end_of_generation(page: Page) -> None:
    """Ban Gemma's end-of-generation tokens in the page's chat requests, so that an answer runs
    to max_tokens: the page's own request, `logit_bias` added on its way out (the page has no
    control for it)."""

    async def amend(route: Route) -> None:
        body = route.request.post_data_json
        await route.continue_(post_data=json.dumps({**body, "logit_bias": EOS_BAN}))

    await page.route(f"**/{CHAT}", amend)
