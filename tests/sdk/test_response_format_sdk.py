"""`response_format` through the official `openai` SDK: the answer always parses as JSON and
matches the schema, because a grammar constrains it. The schemas have short valid documents
(enums, booleans, short strings) so the default Gemma model finishes well within max_tokens."""

from __future__ import annotations

import asyncio
import json
from typing import Any, Literal

import openai
import pytest
from pydantic import BaseModel

from tests.sdk.conftest import assert_error_says
from tests.sdk.schema_check import problems

VERDICT = {
    "type": "object",
    "properties": {
        "answer": {"type": "string", "enum": ["yes", "no"]},
        "confident": {"type": "boolean"},
    },
    "required": ["answer", "confident"],
    "additionalProperties": False,
}
COLOR = {
    "type": "object",
    "properties": {"color": {"type": "string", "maxLength": 10}},
    "required": ["color"],
}
SKY = [{"role": "user", "content": "Is the sky blue? Answer in JSON."}]


def as_schema(schema: dict[str, Any], name: str = "answer") -> dict[str, Any]:
    return {"type": "json_schema", "json_schema": {"name": name, "schema": schema, "strict": True}}


@pytest.mark.parametrize(
    ("schema", "question", "n"),
    [
        (VERDICT, "Is the sky blue? Answer in JSON.", 1),
        (COLOR, "Name a color.", 1),
        (VERDICT, "Is fire cold?", 2),
    ],
    ids=["enum and boolean", "short string", "n=2 sampled"],
)
async def test_json_schema_answers_match_the_schema(aclient, schema, question, n):
    completion = await aclient.chat.completions.create(
        model="any-model",
        messages=[{"role": "user", "content": question}],
        response_format=as_schema(schema),
        max_tokens=64,
        temperature=0,
        n=n,
        seed=11,
    )
    assert len(completion.choices) == n
    for choice in completion.choices:
        assert choice.finish_reason == "stop", choice.message.content
        assert problems(json.loads(choice.message.content), schema) == []


async def test_json_schema_stream(aclient):
    stream = await aclient.chat.completions.create(
        model="any-model",
        messages=SKY,
        response_format=as_schema(VERDICT),
        max_tokens=64,
        temperature=0,
        stream=True,
    )
    chunks = [chunk.choices[0] async for chunk in stream]
    assert chunks[-1].finish_reason == "stop"
    text = "".join(chunk.delta.content or "" for chunk in chunks)
    assert problems(json.loads(text), VERDICT) == []


class Verdict(BaseModel):
    answer: Literal["yes", "no"]
    confident: bool


async def test_the_sdk_parse_helper(sync_client):
    completion = await asyncio.to_thread(
        sync_client.chat.completions.parse,
        model="any-model",
        messages=SKY,
        response_format=Verdict,
        max_tokens=64,
        temperature=0,
    )
    [choice] = completion.choices
    assert choice.finish_reason == "stop"
    assert isinstance(choice.message.parsed, Verdict)


async def test_json_object(aclient):
    shown = [
        {"role": "user", "content": "Is water wet? Answer in JSON."},
        {"role": "assistant", "content": '{"answer": "yes"}'},
        {"role": "user", "content": "Is fire cold? Answer in JSON."},
    ]
    completion = await aclient.chat.completions.create(
        model="any-model",
        messages=shown,
        response_format={"type": "json_object"},
        max_tokens=40,
        temperature=0,
    )
    [choice] = completion.choices
    assert choice.finish_reason == "stop", choice.message.content
    assert isinstance(json.loads(choice.message.content), dict)


LOOK_UP = {
    "type": "function",
    "function": {
        "name": "look_up",
        "description": "Look a fact up",
        "parameters": {
            "type": "object",
            "properties": {"topic": {"type": "string", "enum": ["sky", "sea"]}},
            "required": ["topic"],
        },
    },
}


@pytest.mark.parametrize(
    ("question", "tool_choice"),
    [
        ("Look up the sky.", "auto"),
        ("Is the sky blue? Answer in JSON.", {"type": "function", "function": {"name": "look_up"}}),
    ],
    ids=["a call asked for", "a call forced"],
)
async def test_with_tools_beside_a_format_the_answer_can_be_a_call(aclient, question, tool_choice):
    # The answer may be a call or text in the format; here it is a call (asked for, which the
    # default model does at temperature 0, or forced), so a build that drops the tools beside
    # a response format answers in the format and fails.
    completion = await aclient.chat.completions.create(
        model="any-model",
        messages=[{"role": "user", "content": question}],
        tools=[LOOK_UP],
        tool_choice=tool_choice,
        response_format=as_schema(VERDICT),
        max_tokens=64,
        temperature=0,
    )
    [choice] = completion.choices
    assert choice.message.tool_calls, f"no call: {choice.message.content!r}"
    assert choice.finish_reason == "tool_calls"
    [call] = choice.message.tool_calls
    assert call.function.name == "look_up"
    assert json.loads(call.function.arguments) == {"topic": "sky"}


ERRORS = [
    (
        "a schema the grammar converter rejects",
        as_schema({"type": "object", "properties": {"x": {"type": "nonsense"}}}),
        '"response_format.json_schema.schema" cannot be turned into a grammar: Unrecognized '
        "schema: {'type': 'nonsense'}; simplify the schema, or use {\"type\": \"json_object\"}.",
    ),
    (
        "a string bound too large to write out",
        as_schema({"type": "string", "maxLength": 100000}),
        '"response_format.json_schema.schema" cannot be turned into a grammar: "maxLength" '
        'repeats 100000 times; the limit is 1000; simplify the schema, or use {"type": '
        '"json_object"}.',
    ),
    (
        "no schema",
        {"type": "json_schema", "json_schema": {"name": "answer"}},
        '"response_format.json_schema" has no "schema" object; put the JSON schema of the answer '
        'there, or use {"type": "json_object"} for any JSON object.',
    ),
]


@pytest.mark.parametrize(
    ("response_format", "detail"), [c[1:] for c in ERRORS], ids=[c[0] for c in ERRORS]
)
@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
async def test_unusable_formats_are_bad_requests(aclient, response_format, detail, stream):
    with pytest.raises(openai.BadRequestError) as caught:
        await aclient.chat.completions.create(
            model="any-model", messages=SKY, response_format=response_format, stream=stream
        )
    assert_error_says(caught.value, detail)
