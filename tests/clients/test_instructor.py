"""instructor, unchanged: a pydantic model out of its OpenAI modes whose shape the server
enforces (a forced tool call; a `json_schema` response format), whole and partially streamed.
(Its `JSON` mode only describes the schema in the prompt, which a 270M model echoes back.)"""

from __future__ import annotations

from collections.abc import AsyncIterator

import instructor
import openai
import pytest

from tests.clients.models import CITY_PROMPT, Answers, City
from tests.sdk.conftest import base_url

pytestmark = pytest.mark.needs_model

MODES = [instructor.Mode.TOOLS, instructor.Mode.JSON_SCHEMA]


@pytest.fixture
async def openai_client(server, answers: Answers) -> AsyncIterator[openai.AsyncOpenAI]:
    client = openai.AsyncOpenAI(
        base_url=base_url(server), api_key="x", max_retries=0, http_client=answers.http
    )
    yield client
    await client.close()


def ask(openai_client: openai.AsyncOpenAI, mode: instructor.Mode, method: str) -> object:
    """The City question through instructor's `method` ("create" or "create_partial")."""
    client = instructor.from_openai(openai_client, mode=mode)
    return getattr(client.chat.completions, method)(
        model="m",
        response_model=City,
        messages=[{"role": "user", "content": CITY_PROMPT}],
        max_tokens=64,
        temperature=0,
        max_retries=0,
    )


@pytest.mark.parametrize("mode", MODES, ids=[mode.value for mode in MODES])
async def test_a_model_comes_back(openai_client, answers, mode):
    city = await ask(openai_client, mode, "create")
    assert isinstance(city, City)
    assert city.model_dump() == answers.city()


@pytest.mark.parametrize("mode", MODES, ids=[mode.value for mode in MODES])
async def test_partial_streaming_grows_to_the_model(openai_client, answers, mode):
    partials = [partial async for partial in ask(openai_client, mode, "create_partial")]
    assert len(partials) > 1, "one piece: the answer was not streamed"
    whole = answers.city()  # what the stream carried
    assert partials[-1].model_dump() == whole
    for partial in partials:  # each one a beginning of the answer
        assert whole["name"].startswith(partial.name or "")
        assert whole["country"].startswith(partial.country or "")
