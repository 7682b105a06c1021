"""An aiohttp test client per test, built around the session's engine."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from edgeserve.config import Settings
from edgeserve.engine.client import EngineClient
from edgeserve.http.app import create_app

EOS_BAN = {"1": -100, "106": -100, "212": -100}


def server_settings(model_path: Path, **overrides: Any) -> Settings:
    """Server settings for in-process tests (the engine fixture fixes the engine's own)."""
    return Settings(
        model=str(model_path), model_name="gemma-test", ping_interval_s=15.0, **overrides
    )


@pytest.fixture
def settings(model_path: Path) -> Settings:
    """The default in-process settings."""
    return server_settings(model_path)


@pytest.fixture
def make_client(aiohttp_client, engine, settings):
    """Build a test client; pass Settings overrides as keywords."""

    async def make(**overrides):
        app = create_app(replace(settings, **overrides), EngineClient(engine))
        return await aiohttp_client(app)

    return make


@pytest.fixture
async def client(make_client):
    """A client of the default app."""
    return await make_client()
