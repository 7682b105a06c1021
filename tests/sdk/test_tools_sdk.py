"""Tools through the official `openai` SDK, streamed (divergence 6) and not.

Left to itself ("auto") the default Gemma base model rarely answers with a tool call, so those
tests check that the answer is well-formed either way; `tool_choice` "required" or a named
function forces a call with a grammar, so those tests check the call itself.
tests/unit/test_tool_calls.py and test_responses_openai.py cover the parsing and the tool-call
answer.
"""

from __future__ import annotations

import asyncio
import json
import re
from typing import Any

import openai
import pytest

from tests.integration.engine_idle import assert_engine_idle
from tests.sdk.conftest import assert_error_says
from tests.sdk.schema_check import problems

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}
ASK = [
    {"role": "system", "content": "Answer only with a function call."},
    {"role": "user", "content": "What is the weather in Paris?"},
]


@pytest.mark.parametrize("tool_choice", [None, "auto", "none"])
async def test_tools_answer_is_well_formed(aclient, tool_choice):
    extra = {} if tool_choice is None else {"tool_choice": tool_choice}
    completion = await aclient.chat.completions.create(
        model="any-model", messages=ASK, tools=[WEATHER], max_tokens=24, temperature=0, **extra
    )
    [choice] = completion.choices
    message = choice.message
    if message.tool_calls:
        assert tool_choice != "none"
        assert choice.finish_reason == "tool_calls" and message.content is None
        for call in message.tool_calls:
            assert re.fullmatch(r"call_[0-9a-f]{32}", call.id) and call.type == "function"
            assert isinstance(json.loads(call.function.arguments), dict)
    else:
        assert isinstance(message.content, str)
        assert choice.finish_reason in ("stop", "length")


async def test_a_past_tool_call_and_its_result_are_accepted(aclient):
    messages = [
        *ASK,
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "Sunny, 21 °C"},
    ]
    completion = await aclient.chat.completions.create(
        model="any-model", messages=messages, tools=[WEATHER], max_tokens=4, temperature=0
    )
    assert completion.choices[0].finish_reason in ("stop", "length", "tool_calls")


CITY = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "enum": ["Paris", "London", "Tokyo"]},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
    },
    "required": ["city", "unit"],
}
FORECAST = {
    "type": "function",
    "function": {"name": "get_forecast", "description": "The weather", "parameters": CITY},
}
CLOCK = {
    "type": "function",
    "function": {
        "name": "get_time",
        "description": "The time in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 12}},
            "required": ["city"],
            "additionalProperties": False,
        },
    },
}
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in (FORECAST, CLOCK)}


def assert_forced_calls(completion, names: set[str]) -> None:
    """Every choice is exactly one call of one of `names`, arguments matching its schema."""
    for choice in completion.choices:
        message = choice.message
        assert choice.finish_reason == "tool_calls", message.content
        assert message.content is None
        [call] = message.tool_calls
        assert re.fullmatch(r"call_[0-9a-f]{32}", call.id) and call.type == "function"
        assert call.function.name in names
        arguments = json.loads(call.function.arguments)
        assert problems(arguments, SCHEMAS[call.function.name]) == []


async def test_required_forces_a_call(aclient):
    completion = await aclient.chat.completions.create(
        model="any-model",
        messages=[{"role": "user", "content": "What is the weather in Paris?"}],
        tools=[FORECAST, CLOCK],
        tool_choice="required",
        max_tokens=64,
        n=2,
    )
    assert len(completion.choices) == 2
    assert_forced_calls(completion, {"get_forecast", "get_time"})


async def test_a_named_function_forces_that_call(aclient, sync_client):
    named = {"type": "function", "function": {"name": "get_time"}}
    request = {
        "model": "any-model",
        "messages": [{"role": "user", "content": "Is it raining in Paris?"}],
        "tools": [FORECAST, CLOCK],
        "tool_choice": named,
        "max_tokens": 64,
        "temperature": 0,
    }
    completion = await aclient.chat.completions.create(**request)
    assert_forced_calls(completion, {"get_time"})
    again = await asyncio.to_thread(sync_client.chat.completions.create, **request)
    assert again.choices[0].message.tool_calls[0].function == (
        completion.choices[0].message.tool_calls[0].function
    )


FORCED_ERRORS = [
    (
        "an unknown function",
        {
            "tools": [FORECAST, CLOCK],
            "tool_choice": {"type": "function", "function": {"name": "x"}},
        },
        '"tool_choice" names the function "x", which is not in "tools" ("get_forecast", '
        '"get_time"); name one of those.',
    ),
    (
        "required without tools",
        {"tool_choice": "required"},
        '"tool_choice": "required" forces a tool call but the request has no "tools"; add the '
        "functions or leave tool_choice out.",
    ),
]


@pytest.mark.parametrize(
    ("fields", "detail"), [c[1:] for c in FORCED_ERRORS], ids=[c[0] for c in FORCED_ERRORS]
)
async def test_forced_call_errors(aclient, fields, detail):
    with pytest.raises(openai.BadRequestError) as caught:
        await aclient.chat.completions.create(model="any-model", messages=ASK, **fields)
    assert_error_says(caught.value, detail)


def strict(tool: dict[str, Any]) -> dict[str, Any]:
    """`tool` marked `strict`, which the SDK's stream helper asks for before it parses calls
    (openai < 3.10); edgeserve enforces every tool's parameters either way."""
    return {**tool, "function": {**tool["function"], "strict": True}}


async def test_a_streamed_call_accumulates_to_the_non_streamed_one(aclient, engine):
    request = {
        "model": "any-model",
        "messages": [{"role": "user", "content": "What is the weather in Tokyo?"}],
        "tools": [strict(FORECAST), strict(CLOCK)],
        "tool_choice": {"type": "function", "function": {"name": "get_forecast"}},
        "max_tokens": 64,
        "temperature": 0,
    }
    plain = await aclient.chat.completions.create(**request)
    async with aclient.chat.completions.stream(**request) as stream:
        events = [event async for event in stream]
        streamed = await stream.get_final_completion()
    assert_forced_calls(plain, {"get_forecast"})
    [choice] = streamed.choices
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content == "", "the role chunk's empty content, as the reference sends"
    [call] = choice.message.tool_calls
    assert re.fullmatch(r"call_[0-9a-f]{32}", call.id) and call.type == "function"
    [expected] = plain.choices[0].message.tool_calls
    assert call.function.name == expected.function.name
    assert call.function.arguments == expected.function.arguments
    pieces = [e.arguments_delta for e in events if e.type == "tool_calls.function.arguments.delta"]
    assert len(pieces) > 2 and "".join(pieces) == call.function.arguments
    [done] = [e for e in events if e.type == "tool_calls.function.arguments.done"]
    assert (done.name, done.arguments) == (call.function.name, call.function.arguments)
    await assert_engine_idle(engine)


async def test_sync_streamed_call(sync_client):
    def run() -> tuple[list[object], str | None]:
        chunks = sync_client.chat.completions.create(
            model="any-model",
            messages=[{"role": "user", "content": "What time is it in London?"}],
            tools=[CLOCK],
            tool_choice="required",
            max_tokens=48,
            stream=True,
        )
        calls: dict[int, list[str]] = {}
        reason = None
        for chunk in chunks:
            choice = chunk.choices[0]
            reason = choice.finish_reason or reason
            for piece in choice.delta.tool_calls or ():
                if piece.id is not None:
                    assert piece.function.name == "get_time" and piece.type == "function"
                    calls[piece.index] = []
                calls[piece.index].append(piece.function.arguments)
        return ["".join(parts) for parts in calls.values()], reason

    arguments, reason = await asyncio.to_thread(run)
    assert reason == "tool_calls"
    [text] = arguments
    assert problems(json.loads(text), SCHEMAS["get_time"]) == []


async def test_streamed_tools_with_n_2_are_refused(aclient):
    with pytest.raises(openai.BadRequestError) as caught:
        await aclient.chat.completions.create(
            model="any-model", messages=ASK, tools=[WEATHER], stream=True, n=2
        )
    assert_error_says(caught.value, "Cannot stream multiple responses.")
