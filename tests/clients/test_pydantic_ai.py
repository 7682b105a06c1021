"""pydantic-ai, unchanged: text and structured runs (its output tool is a forced tool call),
streamed as well."""

from __future__ import annotations

from collections.abc import AsyncIterator

import openai
import pytest
from pydantic_ai import Agent
from pydantic_ai.models.openai import OpenAIChatModel
from pydantic_ai.providers.openai import OpenAIProvider

from tests.clients.models import CITY_PROMPT, Answers, City
from tests.sdk.conftest import base_url

pytestmark = pytest.mark.needs_model

MAX_TOKENS = 64
SETTINGS = {"temperature": 0.0, "max_tokens": MAX_TOKENS}
HELLO = "Say hello in one word."
COUNT = "Count from one to five."


@pytest.fixture
async def model(server, answers: Answers) -> AsyncIterator[OpenAIChatModel]:
    client = openai.AsyncOpenAI(
        base_url=base_url(server), api_key="x", max_retries=0, http_client=answers.http
    )
    yield OpenAIChatModel("m", provider=OpenAIProvider(openai_client=client))
    await client.close()


async def test_text_run(model, answers):
    result = await Agent(model, model_settings=SETTINGS).run(HELLO)
    assert result.output == answers.last()


async def test_structured_run(model, answers):
    result = await Agent(model, output_type=City, model_settings=SETTINGS).run(CITY_PROMPT)
    assert isinstance(result.output, City)
    assert result.output.model_dump() == answers.city()


async def test_streamed_text_run(model, answers):
    agent = Agent(model, model_settings=SETTINGS)
    async with agent.run_stream(COUNT) as run:
        pieces = [text async for text in run.stream_text(delta=True)]
    assert len(pieces) > 1
    assert "".join(pieces) == answers.last()


async def test_streamed_structured_run(model, answers):
    agent = Agent(model, output_type=City, model_settings=SETTINGS)
    async with agent.run_stream(CITY_PROMPT) as run:
        partials = [partial async for partial in run.stream_output(debounce_by=None)]
    assert isinstance(partials[-1], City)
    assert partials[-1].model_dump() == answers.city()  # what the stream carried
