"""Client libraries users run (instructor, LangChain, pydantic-ai, LiteLLM, lm-eval), unchanged,
against edgeserve on a real port around the session's engine (the fixtures of tests/sdk)."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator

import pytest

from tests.clients.models import Answers
from tests.sdk.conftest import base_url, make_server, server, settings

# LiteLLM fetches its model price list from GitHub at import unless told to use its own copy.
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

__all__ = ["base_url", "make_server", "server", "settings"]


@pytest.fixture
async def answers() -> AsyncIterator[Answers]:
    """An HTTP client for a library, recording the server's answers."""
    recorder = Answers()
    yield recorder
    await recorder.http.aclose()
