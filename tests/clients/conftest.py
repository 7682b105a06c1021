"""Client libraries users run (instructor, LangChain, pydantic-ai, LiteLLM, lm-eval), unchanged,
against edgeserve on a real port around the session's engine (the fixtures of tests/sdk)."""

from __future__ import annotations

import os

from tests.sdk.conftest import aclient, base_url, make_server, server, settings

# LiteLLM fetches its model price list from GitHub at import unless told to use its own copy.
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

__all__ = ["aclient", "base_url", "make_server", "server", "settings"]
