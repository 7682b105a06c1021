"""pydantic-ai, unchanged: text and structured runs (its output tool is a forced tool call),
streamed as well."""

from __future__ import annotations

import pytest
from pydantic_ai import Agent
from pydantic_ai.models.openai import OpenAIChatModel
from pydantic_ai.providers.openai import OpenAIProvider

from tests.clients.models import CITY_PROMPT, City

pytestmark = pytest.mark.needs_model

SETTINGS = {"temperature": 0.0, "max_tokens": 64}


@pytest.fixture
async def model(aclient) -> OpenAIChatModel:
    return OpenAIChatModel("m", provider=OpenAIProvider(openai_client=aclient))


async def test_text_run(model):
    result = await Agent(model, model_settings=SETTINGS).run("Say hello in one word.")
    assert isinstance(result.output, str) and result.output


async def test_structured_run(model):
    result = await Agent(model, output_type=City, model_settings=SETTINGS).run(CITY_PROMPT)
    assert isinstance(result.output, City)


async def test_streamed_text_run(model):
    agent = Agent(model, model_settings=SETTINGS)
    async with agent.run_stream("Count from one to five.") as run:
        pieces = [text async for text in run.stream_text(delta=True)]
    assert len(pieces) > 1 and "".join(pieces)


async def test_streamed_structured_run(model):
    agent = Agent(model, output_type=City, model_settings=SETTINGS)
    async with agent.run_stream(CITY_PROMPT) as run:
        partials = [partial async for partial in run.stream_output(debounce_by=None)]
    assert isinstance(partials[-1], City)
