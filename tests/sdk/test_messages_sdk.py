"""Anthropic's Messages API through the official `anthropic` SDK: `messages.create`,
`messages.stream`, tools with a tool_use / tool_result round trip, `count_tokens`, the
`x-api-key` header and Anthropic-shaped errors. tests/unit/test_anthropic_messages.py covers the
translation; tests/integration/test_anthropic_messages_http.py the wire events and disconnects."""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator

import anthropic
import pytest
from aiohttp.test_utils import TestServer

from tests.sdk.conftest import TIMEOUT_S

ASK = [{"role": "user", "content": "Name three colours."}]
WEATHER = {
    "name": "get_weather",
    "description": "Get the current weather in a city",
    "input_schema": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    },
}
# anthropic 2.x's `messages.create` no longer takes temperature (Anthropic's newest models fix
# it); the API, and this server, still do.
GREEDY = {"temperature": 0}
WEATHER_ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


def anthropic_client(server: TestServer, **auth: str) -> anthropic.AsyncAnthropic:
    """An async SDK client of `server` (no retries, so errors surface at once)."""
    auth = auth or {"api_key": "x"}
    return anthropic.AsyncAnthropic(
        base_url=str(server.make_url("")), max_retries=0, timeout=TIMEOUT_S, **auth
    )


@pytest.fixture
async def claude(server: TestServer) -> AsyncIterator[anthropic.AsyncAnthropic]:
    client = anthropic_client(server)
    yield client
    await client.close()


async def test_create_answers_a_message(claude):
    message = await claude.messages.create(
        model="any-model", max_tokens=8, messages=ASK, extra_body=GREEDY
    )
    assert re.fullmatch(r"msg_[0-9a-f]{32}", message.id)
    assert message.type == "message" and message.role == "assistant"
    assert message.model == "any-model"
    [block] = message.content
    assert block.type == "text" and block.text
    assert message.stop_reason in ("end_turn", "max_tokens") and message.stop_sequence is None
    assert 0 < message.usage.output_tokens <= 8
    counted = await claude.messages.count_tokens(model="any-model", messages=ASK)
    usage = message.usage
    assert usage.input_tokens + usage.cache_read_input_tokens == counted.input_tokens > 0


async def test_max_tokens_ends_the_answer(claude):
    message = await claude.messages.create(
        model="m", max_tokens=2, messages=ASK, system="Answer at length.", extra_body=GREEDY
    )
    assert message.stop_reason == "max_tokens" and message.usage.output_tokens == 2


async def test_a_stop_sequence_is_reported(claude):
    ask = {"model": "m", "messages": ASK, "extra_body": GREEDY}
    whole = await claude.messages.create(max_tokens=24, **ask)
    text = whole.content[0].text
    words = [word for word in text.split() if text.index(word) > 0]
    assert words, f"the answer {text!r} has no second word"
    stopped = await claude.messages.create(max_tokens=24, stop_sequences=[words[0]], **ask)
    assert stopped.stop_reason == "stop_sequence" and stopped.stop_sequence == words[0]
    assert stopped.content[0].text == text[: text.index(words[0])]


async def test_stream_gives_the_same_answer_as_create(claude):
    ask = {"model": "m", "max_tokens": 12, "messages": ASK, "extra_body": GREEDY}
    whole = await claude.messages.create(**ask)
    async with claude.messages.stream(**ask) as stream:
        texts = [text async for text in stream.text_stream]
        final = await stream.get_final_message()
    assert len(texts) > 1 and "".join(texts) == whole.content[0].text
    assert final.content[0].text == whole.content[0].text
    assert final.stop_reason == whole.stop_reason
    assert final.usage.output_tokens == whole.usage.output_tokens
    assert final.usage.input_tokens == whole.usage.input_tokens


async def test_a_forced_tool_is_called(claude):
    message = await claude.messages.create(
        model="m",
        max_tokens=64,
        messages=WEATHER_ASK,
        tools=[WEATHER],
        tool_choice={"type": "tool", "name": "get_weather"},
        extra_body=GREEDY,
    )
    [call] = message.content
    assert call.type == "tool_use" and call.name == "get_weather"
    assert re.fullmatch(r"toolu_[0-9a-f]{32}", call.id)
    assert isinstance(call.input["city"], str)
    assert message.stop_reason == "tool_use"


async def test_a_streamed_tool_call_adds_up_to_its_input(claude):
    ask = {
        "model": "m",
        "max_tokens": 64,
        "messages": WEATHER_ASK,
        "tools": [WEATHER],
        "tool_choice": {"type": "any"},
        "extra_body": GREEDY,
    }
    whole = await claude.messages.create(**ask)
    partial = []
    async with claude.messages.stream(**ask) as stream:
        async for event in stream:
            if event.type == "content_block_delta" and event.delta.type == "input_json_delta":
                partial.append(event.delta.partial_json)
        final = await stream.get_final_message()
    [call] = final.content
    assert call.type == "tool_use" and final.stop_reason == "tool_use"
    assert len(partial) > 1 and json.loads("".join(partial)) == call.input
    assert call.input == whole.content[0].input


async def test_a_tool_result_round_trip(claude):
    first = await claude.messages.create(
        model="m",
        max_tokens=64,
        messages=WEATHER_ASK,
        tools=[WEATHER],
        tool_choice={"type": "any"},
        extra_body=GREEDY,
    )
    [call] = first.content
    result = {"type": "tool_result", "tool_use_id": call.id, "content": "Sunny, 21 °C"}
    messages = [
        *WEATHER_ASK,
        {"role": "assistant", "content": [call.model_dump()]},
        {"role": "user", "content": [result]},
    ]
    answer = await claude.messages.create(
        model="m", max_tokens=8, messages=messages, tools=[WEATHER], extra_body=GREEDY
    )
    assert answer.stop_reason in ("end_turn", "max_tokens", "tool_use")
    counted = await claude.messages.count_tokens(model="m", messages=messages, tools=[WEATHER])
    assert (
        counted.input_tokens
        > (await claude.messages.count_tokens(model="m", messages=ASK)).input_tokens
    )


async def test_count_tokens_counts_the_tools_and_the_system_prompt(claude):
    bare = await claude.messages.count_tokens(model="m", messages=ASK)
    with_tools = await claude.messages.count_tokens(model="m", messages=ASK, tools=[WEATHER])
    with_system = await claude.messages.count_tokens(model="m", messages=ASK, system="Be brief.")
    assert with_tools.input_tokens > with_system.input_tokens > bare.input_tokens > 0


async def test_the_key_is_taken_from_x_api_key_or_a_bearer_token(make_server):
    server = await make_server(api_keys=("secret",))
    for auth in ({"api_key": "secret"}, {"auth_token": "secret"}):
        client = anthropic_client(server, **auth)
        counted = await client.messages.count_tokens(model="m", messages=ASK)
        assert counted.input_tokens > 0
        await client.close()
    client = anthropic_client(server, api_key="wrong")
    with pytest.raises(anthropic.AuthenticationError) as caught:
        await client.messages.create(model="m", max_tokens=2, messages=ASK)
    await client.close()
    assert caught.value.body == {
        "type": "error",
        "error": {"type": "authentication_error", "message": "Invalid API key."},
    }


@pytest.mark.parametrize(
    ("fields", "says"),
    [
        ({"max_tokens": 0}, '"max_tokens" must be at least 1, got 0.'),
        ({"extra_body": {"temperature": 1.5}}, '"temperature" must be between 0.0 and 1.0'),
        (
            {"messages": [*ASK, {"role": "assistant", "content": "Red"}]},
            "The last message has role",
        ),
        ({"tool_choice": {"type": "any"}}, '"tool_choice" has type "any" but the request'),
        (
            {"messages": [{"role": "user", "content": [{"type": "document", "source": {}}]}]},
            'messages[0].content[0] is a "document" block',
        ),
    ],
)
async def test_invalid_requests_are_bad_request_errors(claude, fields, says):
    ask = {"model": "m", "max_tokens": 4, "messages": ASK} | fields
    with pytest.raises(anthropic.BadRequestError) as caught:
        await claude.messages.create(**ask)
    error = caught.value.body
    assert error["type"] == "error" and error["error"]["type"] == "invalid_request_error"
    assert error["error"]["message"].startswith(says)
