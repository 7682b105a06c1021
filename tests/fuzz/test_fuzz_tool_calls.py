"""Fuzzing the readers of generated text for tool calls (api/common/tool_calls.py,
tool_stream.py, json_scan.py) on model-like answers: calls of every family (JSON objects and
arrays, Hermes tags, Mistral's forms, LlamaFactory's Action lines) with recursive arguments,
markers, fences and stray text, cut short or with characters dropped or repeated. Neither
reader may raise; every call found has a name and arguments that are a JSON object, every
piece is sendable as UTF-8, and what a stream releases does not depend on how the text was
split."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import example, given
from hypothesis import strategies as st

from edgeserve.api.common.json_scan import Broken, JsonValue
from edgeserve.api.common.tool_calls import parse_tool_calls
from edgeserve.api.common.tool_stream import CallStart, Content, ToolCallStream
from tests.fuzz.budget import fuzz_settings
from tests.fuzz.json_strategies import json_values, to_json

BIG = "1" * 5000
MARKERS = [
    "<tool_call>",
    "</tool_call>",
    "[TOOL_CALLS]",
    "[ARGS]",
    "[CALL_ID]",
    "<|python_tag|>",
    "Action: ",
    "\nAction Input: ",
    "```",
    "```json\n",
    "\n```",
    " ",
    "\n",
    ";",
    ",",
    "[",
    "]",
    "{",
    "}",
    '"',
    "\\",
    "\\u",
    "\\ud83d",
    "\\ude00",
]
names = st.one_of(
    st.sampled_from(["get_weather", "f", "a.b-c", " ", "", "\\ud800"]), st.text(max_size=6)
)


@st.composite
def calls(draw: st.DrawFn) -> str:
    """One call's text, in one of the families' shapes."""
    arguments = draw(
        st.one_of(st.dictionaries(st.text(max_size=4), json_values(8), max_size=3), json_values(8))
    )
    key = draw(st.sampled_from(["arguments", "parameters", "args"]))
    as_string = draw(st.booleans())
    members: dict[str, Any] = {
        "name": draw(names),
        key: to_json(arguments) if as_string else arguments,
    }
    if draw(st.booleans()):
        members = dict(reversed(list(members.items())))
    if draw(st.booleans()):
        members["id"] = draw(json_values(3))
    text = to_json(members)
    shape = draw(st.sampled_from(["json", "hermes", "mistral-list", "mistral-args", "action"]))
    if shape == "hermes":
        return f"<tool_call>{text}</tool_call>"
    if shape == "mistral-list":
        return f"[TOOL_CALLS] [{text}]"
    if shape == "mistral-args":
        return f"[TOOL_CALLS]{members.get('name')}[ARGS]{to_json(arguments)}"
    if shape == "action":
        return f"Action: {members.get('name')}\nAction Input: {to_json(arguments)}"
    return text


@st.composite
def answers(draw: st.DrawFn) -> str:
    """A model-like answer: calls and markers and text, then perhaps damaged."""
    parts = draw(
        st.lists(st.one_of(calls(), st.sampled_from(MARKERS), st.text(max_size=8)), max_size=6)
    )
    text = "".join(parts)
    damage = draw(st.sampled_from(["none", "none", "cut", "drop", "repeat"]))
    if damage == "none" or not text:
        return text
    position = draw(st.integers(0, len(text) - 1))
    if damage == "cut":
        return text[:position]
    if damage == "drop":
        return text[:position] + text[position + 1 :]
    return text[:position] + text[position] * draw(st.integers(2, 5)) + text[position:]


def split(text: str, cuts: list[int]) -> list[str]:
    points = sorted({cut % (len(text) + 1) for cut in cuts})
    return [text[a:b] for a, b in zip([0, *points], [*points, len(text)], strict=True)]


def streamed(parts: list[str]) -> tuple[str, list[tuple[str, str]], bool]:
    """What a client holds once a stream of `parts` ends: the content, each call's name and
    joined arguments, and whether the answer was calls. Every piece must be sendable."""
    reader = ToolCallStream()
    content = ""
    found: list[tuple[str, str]] = []
    for piece in [piece for part in parts for piece in reader.feed(part)] + reader.finish():
        if isinstance(piece, CallStart):
            assert piece.index == len(found)
            found.append((piece.name, ""))
            piece.name.encode()
            continue
        assert piece.text, "no empty pieces"
        piece.text.encode()
        if isinstance(piece, Content):
            content += piece.text
        else:
            assert piece.index == len(found) - 1
            found[-1] = (found[-1][0], found[-1][1] + piece.text)
    return content, found, reader.called


def assert_arguments(arguments: str, text: str) -> None:
    """`arguments` is JSON text in UTF-8: an object, except in LlamaFactory's `Action Input:`
    format, which (as the reference's extractor) takes any JSON value."""
    arguments.encode()
    value = json.loads(arguments)
    assert isinstance(value, dict) or "Action Input:" in text, arguments


@fuzz_settings(400)
@given(text=answers())
@example(text='{"name": "f", "arguments": {"a": ' + BIG + "}}")
@example(text='<tool_call>{"name": "f", "arguments": {"a": ' + BIG + "}}</tool_call>")
@example(text="Action: f\nAction Input: " + BIG)
@example(text="Action: get_weather\nAction Input: null")
@example(text='[TOOL_CALLS]f[ARGS]{"a": ' + BIG + "}")
@example(text='{"name": "f", "arguments": "{\\"a\\": ' + BIG + '}"}')
def test_whole_answers_parse_to_calls_or_none(text: str) -> None:
    found = parse_tool_calls(text)
    if found is None:
        return
    assert found
    for call in found:
        assert call.name and call.name.encode()
        assert_arguments(call.arguments, text)


@fuzz_settings(200)
@given(text=answers(), cuts=st.lists(st.integers(0, 10_000), max_size=8))
@example(text='{"name": "f", "arguments": {"a": ' + BIG + "}}", cuts=[])
@example(text='{"name": "f", "arguments": "{\\"a\\": ' + BIG + '}"}', cuts=[])
@example(text="<tool_call>" + BIG, cuts=[])
def test_streams_release_the_same_pieces_however_the_text_is_split(
    text: str, cuts: list[int]
) -> None:
    whole = streamed([text])
    assert streamed(split(text, cuts)) == whole
    assert streamed(list(text)) == whole
    _, found, called = whole
    if called:
        for _, arguments in found:
            assert_arguments(arguments, text)


@fuzz_settings(200)
@given(value=json_values(16), text=st.text(max_size=30))
@example(value=None, text=BIG + " ")
def test_the_json_scanner_reads_or_breaks(value: Any, text: str) -> None:
    """JsonValue on a JSON value's text (its output then parses to the same value) and on
    any text: it may only raise Broken."""
    for source in (to_json(value), text):
        reader = JsonValue()
        try:
            for char in source + " ":
                if not reader.feed(char):
                    break
        except Broken:
            continue
        if reader.done and source == to_json(value) and "NaN" not in source:
            try:
                expected = json.loads(source)
            except RecursionError:
                continue
            assert json.loads("".join(reader.out)) == expected
