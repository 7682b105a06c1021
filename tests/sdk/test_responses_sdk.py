"""POST /v1/responses through the official `openai` SDK (`client.responses.create` and
`client.responses.stream`): text, the event sequence, tools, structured output, usage,
max_output_tokens, the stateless 400s and a stream closed early.

tests/unit/test_openai_responses_checks.py covers the translation to chat and the 400s;
tests/unit/test_openai_responses_render.py the bodies and events.
"""

from __future__ import annotations

import json
import re

import openai
import pytest

from tests.integration.engine_idle import assert_engine_idle
from tests.sdk.conftest import assert_error_says
from tests.sdk.schema_check import problems

WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "Get the current weather in a city",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    },
}
CITY = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "population": {"type": "integer"}},
    "required": ["city", "population"],
    "additionalProperties": False,
}
YES_NO = {
    "type": "object",
    "properties": {"yes": {"type": "boolean"}},
    "required": ["yes"],
    "additionalProperties": False,
}
COUNTING = {"model": "any-model", "input": "1, 2, 3, 4, 5, 6, 7, 8,", "temperature": 0}


async def test_create_text(aclient):
    response = await aclient.responses.create(
        model="any-model", instructions="Be brief.", input="Say hello.", max_output_tokens=16
    )
    assert re.fullmatch(r"resp_[0-9a-f]{32}", response.id)
    assert response.object == "response" and response.model == "any-model"
    assert response.status in ("completed", "incomplete")
    [message] = response.output
    assert message.type == "message" and message.role == "assistant"
    assert message.content[0].type == "output_text"
    assert response.output_text == message.content[0].text
    usage = response.usage
    assert usage.input_tokens > 5 and 1 <= usage.output_tokens <= 16
    assert usage.total_tokens == usage.input_tokens + usage.output_tokens
    assert response.instructions == "Be brief." and response.max_output_tokens == 16


async def test_max_output_tokens_makes_it_incomplete(aclient):
    response = await aclient.responses.create(**COUNTING, max_output_tokens=3)
    assert response.status == "incomplete"
    assert response.incomplete_details.reason == "max_output_tokens"
    assert response.usage.output_tokens == 3
    assert response.output[0].status == "incomplete"


async def test_stream_events_and_text_equal_the_non_stream_answer(aclient):
    fields = {**COUNTING, "max_output_tokens": 12}
    expected = await aclient.responses.create(**fields)
    async with aclient.responses.stream(**fields) as stream:
        events = [event async for event in stream]
    # As at OpenAI, a cut answer ends with response.incomplete, which the SDK's
    # get_final_response() does not take (it wants response.completed): read the event.
    final = events[-1].response
    kinds = [event.type for event in events]
    deltas = kinds.count("response.output_text.delta")
    assert deltas >= 1
    assert kinds == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        *["response.output_text.delta"] * deltas,
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.incomplete",
    ]
    assert [event.sequence_number for event in events] == list(range(len(events)))
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == expected.output_text == final.output_text
    assert final.status == "incomplete" and final.usage.output_tokens == 12


async def test_forced_call(aclient):
    response = await aclient.responses.create(
        model="any-model",
        input="What is the weather in Paris?",
        tools=[WEATHER],
        tool_choice={"type": "function", "name": "get_weather"},
        max_output_tokens=64,
        temperature=0,
    )
    assert response.status == "completed"
    [call] = response.output
    assert call.type == "function_call" and call.name == "get_weather"
    assert re.fullmatch(r"call_[0-9a-f]{32}", call.call_id)
    assert problems(json.loads(call.arguments), WEATHER["parameters"]) == []


async def test_streamed_call_and_the_round_trip(aclient):
    fields = {
        "model": "any-model",
        "input": "What is the weather in Paris?",
        "tools": [WEATHER],
        "tool_choice": "required",
        "max_output_tokens": 64,
        "temperature": 0,
    }
    async with aclient.responses.stream(**fields) as stream:
        events = [event async for event in stream]
        final = await stream.get_final_response()
    kinds = [event.type for event in events]
    assert kinds[:3] == ["response.created", "response.in_progress", "response.output_item.added"]
    assert "response.function_call_arguments.delta" in kinds
    assert kinds[-3:] == [
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]
    [call] = final.output
    deltas = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
    assert call.type == "function_call" and deltas == call.arguments
    assert problems(json.loads(call.arguments), WEATHER["parameters"]) == []
    # The call and its output go back as input items; the answer is text again.
    answer = await aclient.responses.create(
        model="any-model",
        input=[
            {"role": "user", "content": "What is the weather in Paris?"},
            {
                "type": "function_call",
                "call_id": call.call_id,
                "name": call.name,
                "arguments": call.arguments,
            },
            {"type": "function_call_output", "call_id": call.call_id, "output": "Sunny, 24 C"},
        ],
        tools=[WEATHER],
        tool_choice="none",
        max_output_tokens=8,
    )
    assert answer.output[0].type == "message"


async def test_structured_output(aclient):
    response = await aclient.responses.create(
        model="any-model",
        input="Name a city and its population as JSON.",
        text={"format": {"type": "json_schema", "name": "city", "schema": CITY, "strict": True}},
        max_output_tokens=64,
        temperature=0,
    )
    assert response.status == "completed"
    assert problems(json.loads(response.output_text), CITY) == []
    assert response.text.format.type == "json_schema"


async def test_structured_output_stream(aclient):
    fields = {
        "model": "any-model",
        "input": "Is the sky blue? Answer as JSON.",
        "text": {"format": {"type": "json_schema", "name": "answer", "schema": YES_NO}},
        "max_output_tokens": 32,
        "temperature": 0,
    }
    async with aclient.responses.stream(**fields) as stream:
        final = await stream.get_final_response()
    assert final.status == "completed"
    assert problems(json.loads(final.output_text), YES_NO) == []


@pytest.mark.parametrize(
    ("fields", "name"),
    [
        ({"previous_response_id": "resp_1"}, "previous_response_id"),
        ({"store": True}, "store"),
        ({"background": True}, "background"),
    ],
)
async def test_stateless_400(aclient, fields, name):
    with pytest.raises(openai.BadRequestError) as caught:
        await aclient.responses.create(model="any-model", input="hi", **fields)
    detail = (
        f'"{name}" is not supported: this server is stateless and keeps no responses; '
        f'send the whole conversation in "input" and leave {name} out.'
    )
    assert_error_says(caught.value, detail)


async def test_stream_closed_early_leaves_the_engine_idle(engine, aclient):
    stream = await aclient.responses.create(**COUNTING, max_output_tokens=1000, stream=True)
    received = [await stream.__anext__() for _ in range(5)]
    assert received[-1].type == "response.output_text.delta"
    assert engine.stats().busy_slots == 1
    await stream.close()
    await assert_engine_idle(engine)
