"""Structured output through the official `openai` SDK at its default sampling (temperature 1,
no seed), as properties over many answers: an answer that stops parses and matches its schema;
an answer cut by max_tokens is a start the grammar accepts, with no raw control character."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from edgeserve.grammars import ANY_JSON_OBJECT, schema_grammar
from tests.sdk.schema_check import problems

pytestmark = pytest.mark.needs_model

ANSWERS = 32  # each ending is ~1 in 3: missing one is a 1-in-200,000 run
PER_REQUEST = 8
PET = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 10},
        "toys": {"type": "array", "items": {"type": "string", "maxLength": 6}, "maxItems": 2},
    },
    "required": ["name", "toys"],
}
ASK = [{"role": "user", "content": "Describe a pet as JSON."}]


def check(grammar_check, gbnf: str, schema: dict[str, Any], text: str, finish: str) -> None:
    assert finish in ("stop", "length"), finish
    if finish == "stop":
        assert grammar_check.accepts(gbnf, text, complete=True), text
        assert problems(json.loads(text), schema) == [], text
    else:
        assert not any(ord(ch) < 0x20 for ch in text), f"raw control character in {text!r}"
        assert grammar_check.accepts(gbnf, text, complete=False), text


async def test_json_object_answers(aclient, grammar_check):
    async def one() -> list[Any]:
        completion = await aclient.chat.completions.create(
            model="any-model",
            messages=ASK,
            response_format={"type": "json_object"},
            max_tokens=16,
            n=PER_REQUEST,
        )
        return completion.choices

    batches = await asyncio.gather(*(one() for _ in range(ANSWERS // PER_REQUEST)))
    choices = [choice for batch in batches for choice in batch]
    assert len(choices) == ANSWERS
    for choice in choices:
        check(
            grammar_check,
            ANY_JSON_OBJECT,
            {"type": "object"},
            choice.message.content,
            choice.finish_reason,
        )
    assert {choice.finish_reason for choice in choices} == {"stop", "length"}


async def test_streamed_json_schema_answers(aclient, grammar_check):
    response_format = {"type": "json_schema", "json_schema": {"name": "pet", "schema": PET}}

    async def one() -> tuple[str, str]:
        stream = await aclient.chat.completions.create(
            model="any-model",
            messages=ASK,
            response_format=response_format,
            max_tokens=20,
            stream=True,
        )
        parts, finish = [], None
        async for chunk in stream:
            for choice in chunk.choices:
                parts.append(choice.delta.content or "")
                finish = choice.finish_reason or finish
        return "".join(parts), finish

    answers: list[tuple[str, str]] = []
    for _ in range(ANSWERS // PER_REQUEST):
        answers += await asyncio.gather(*(one() for _ in range(PER_REQUEST)))
    gbnf = schema_grammar(PET)
    for text, finish in answers:
        check(grammar_check, gbnf, PET, text, finish)
    assert {finish for _, finish in answers} == {"stop", "length"}
