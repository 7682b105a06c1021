"""Grammar-constrained answers at the default sampling (temperature 1, no seed), as properties
over many answers: every answer that ends by itself is a document the grammar accepts and that
parses and matches its schema; every answer cut by max_tokens is a start the grammar accepts
and holds no raw control character (JSON forbids them in strings, and these grammars allow only
spaces between tokens).

The grammar verdicts come from llama.cpp's grammar engine run here on the answer text
(tests/grammar_check.py), so they do not trust the server's bookkeeping; the parse and the
schema check (jsonschema) do not trust the grammar."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from edgeserve.grammars import ANY_JSON_OBJECT, schema_grammar, tool_call_grammar
from tests.grammar_check import GrammarCheck
from tests.sdk.schema_check import problems

pytestmark = pytest.mark.needs_model

ANSWERS = 40  # the rarer ending (a nested document that ends, ~16%) is missed 0.1% of runs
PER_REQUEST = 8
NESTED = {
    "type": "object",
    "properties": {
        "where": {
            "type": "object",
            "properties": {"x": {"type": "integer"}, "y": {"type": "number"}},
            "required": ["x"],
            "additionalProperties": False,
        },
        "tags": {"type": "array", "items": {"enum": ["red", "green", "blue"]}, "maxItems": 3},
    },
    "required": ["where", "tags"],
    "additionalProperties": False,
}
WEATHER = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 16},
        "unit": {"enum": ["celsius", "fahrenheit"]},
        "days": {"type": "array", "items": {"type": "integer"}, "maxItems": 3},
    },
    "required": ["city", "unit"],
    "additionalProperties": False,
}
TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather forecast for a city",
        "parameters": WEATHER,
    },
}


STRING_GRAMMARS = {
    "any object": (ANY_JSON_OBJECT, '{"a": "x\\ny"}'),
    "bounded string": (
        schema_grammar({"type": "object", "properties": {"a": {"type": "string", "maxLength": 9}}}),
        '{"a": "x\\u0001"}',
    ),
    "pattern dot": (
        schema_grammar({"type": "object", "properties": {"a": {"pattern": "^x.y$"}}}),
        '{"a": "x y"}',
    ),
}


@pytest.mark.parametrize(("gbnf", "good"), STRING_GRAMMARS.values(), ids=STRING_GRAMMARS)
def test_json_strings_refuse_raw_control_characters_and_quotes(grammar_check, gbnf, good):
    for bad in ("\n", "\t", "\r", "\x01", "\x1f", '"x'):
        assert not grammar_check.accepts(gbnf, '{"a": "x' + bad, complete=False), repr(bad)
    assert grammar_check.accepts(gbnf, good, complete=True)


async def sampled_answers(client, *bodies: dict[str, Any]) -> list[dict[str, Any]]:
    """ANSWERS choices at the default sampling, PER_REQUEST per request, the requests taking
    the `bodies` in turn."""

    async def one(body: dict[str, Any]) -> list[dict[str, Any]]:
        response = await client.post("/v1/chat/completions", json={**body, "n": PER_REQUEST})
        assert response.status == 200, await response.text()
        return (await response.json())["choices"]

    requests = [bodies[i % len(bodies)] for i in range(ANSWERS // PER_REQUEST)]
    batches = await asyncio.gather(*(one(body) for body in requests))
    return [choice for batch in batches for choice in batch]


def check_cut(grammar_check: GrammarCheck, gbnf: str, text: str) -> None:
    assert not any(ord(ch) < 0x20 for ch in text), f"raw control character in {text!r}"
    assert grammar_check.accepts(gbnf, text, complete=False), f"not a start: {text!r}"


def check_document(
    grammar_check: GrammarCheck, gbnf: str, text: str, schema: dict[str, Any]
) -> None:
    assert grammar_check.accepts(gbnf, text, complete=True), f"not accepted: {text!r}"
    assert problems(json.loads(text), schema) == [], text


def ended_both_ways(choices: list[dict[str, Any]], done: str) -> None:
    """Both branches of the property were exercised (a vacuous run would prove nothing)."""
    reasons = [choice["finish_reason"] for choice in choices]
    assert set(reasons) == {done, "length"}, reasons


async def test_json_object_answers_are_json_objects(client, grammar_check):
    choices = await sampled_answers(
        client,
        {
            "model": "m",
            "messages": [{"role": "user", "content": "Describe a cat as a JSON object."}],
            "response_format": {"type": "json_object"},
            "max_tokens": 16,
        },
    )
    for choice in choices:
        text = choice["message"]["content"]
        if choice["finish_reason"] == "stop":
            check_document(grammar_check, ANY_JSON_OBJECT, text, {"type": "object"})
        else:
            check_cut(grammar_check, ANY_JSON_OBJECT, text)
    ended_both_ways(choices, "stop")


async def test_nested_schema_answers_match_the_schema(client, grammar_check):
    choices = await sampled_answers(
        client,
        {
            "model": "m",
            "messages": [{"role": "user", "content": "Invent a robot part list."}],
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "robot", "schema": NESTED},
            },
            "max_tokens": 32,
        },
    )
    gbnf = schema_grammar(NESTED)
    for choice in choices:
        text = choice["message"]["content"]
        if choice["finish_reason"] == "stop":
            check_document(grammar_check, gbnf, text, NESTED)
        else:
            check_cut(grammar_check, gbnf, text)
    ended_both_ways(choices, "stop")


async def test_forced_tool_calls_follow_the_parameters(client, grammar_check):
    body = {
        "model": "m",
        "messages": [{"role": "user", "content": "Weather in Oslo this week?"}],
        "tools": [TOOL],
        "max_tokens": 28,
    }
    named = {"type": "function", "function": {"name": "get_weather"}}
    choices = await sampled_answers(
        client, {**body, "tool_choice": "required"}, {**body, "tool_choice": named}
    )
    gbnf = tool_call_grammar([("get_weather", WEATHER)])
    for choice in choices:
        message = choice["message"]
        if choice["finish_reason"] == "tool_calls":
            [call] = message["tool_calls"]
            assert call["function"]["name"] == "get_weather"
            assert problems(json.loads(call["function"]["arguments"]), WEATHER) == [], call
        else:
            check_cut(grammar_check, gbnf, message["content"])
    ended_both_ways(choices, "tool_calls")
