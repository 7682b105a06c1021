"""Tools through the official `openai` SDK (non-streamed, as the reference allows).

The default Gemma base model rarely answers with a tool call, so these tests check that the
answer is well-formed either way; tests/unit/test_tool_calls.py and test_responses_openai.py
cover the parsing and the tool-call answer itself.
"""

from __future__ import annotations

import json
import re

import openai
import pytest

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


@pytest.mark.parametrize(
    "tool_choice",
    ["required", {"type": "function", "function": {"name": "get_weather"}}],
    ids=["required", "named"],
)
async def test_forcing_a_tool_is_not_supported_yet(aclient, tool_choice):
    with pytest.raises(openai.BadRequestError) as caught:
        await aclient.chat.completions.create(
            model="any-model", messages=ASK, tools=[WEATHER], tool_choice=tool_choice
        )
    assert "is not supported yet" in caught.value.body["detail"]


async def test_tools_cannot_stream(aclient):
    with pytest.raises(openai.BadRequestError) as caught:
        await aclient.chat.completions.create(
            model="any-model", messages=ASK, tools=[WEATHER], stream=True
        )
    assert caught.value.body == {"detail": "Cannot stream function calls."}
