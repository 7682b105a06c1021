"""edgeserve.tool_stream: what a streamed answer releases, checked as properties.

The pieces of an answer, accumulated as an OpenAI client accumulates `delta.tool_calls` (the
arguments of each index joined), must not depend on how the text was split, must equal what
`parse_tool_calls` finds in the whole text, and must come early: text as soon as it cannot be a
call, arguments as they are generated.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from typing import Any

import pytest

from edgeserve.api.common.tool_calls import ToolCall, parse_tool_calls
from edgeserve.api.common.tool_stream import CallStart, Content, Piece, ToolCallStream


@dataclass
class Accumulated:
    """What a client holds at the end: the content and each call's name and arguments."""

    content: str = ""
    calls: list[ToolCall] = field(default_factory=list)
    called: bool = False


def accumulate(pieces: list[Piece], called: bool = False) -> Accumulated:
    """Join the pieces as a client does; a call's pieces must follow its start, in order."""
    out = Accumulated(called=called)
    for piece in pieces:
        if isinstance(piece, Content):
            out.content += piece.text
        elif isinstance(piece, CallStart):
            assert piece.index == len(out.calls), "calls are numbered 0, 1, ... in order"
            out.calls.append(ToolCall(piece.name, ""))
        else:
            assert piece.index == len(out.calls) - 1, "arguments belong to the latest call"
            last = out.calls[-1]
            out.calls[-1] = ToolCall(last.name, last.arguments + piece.text)
    return out


def stream(parts: list[str]) -> Accumulated:
    """Feed the parts, finish, and accumulate."""
    reader = ToolCallStream()
    pieces: list[Piece] = []
    for part in parts:
        pieces += reader.feed(part)
    pieces += reader.finish()
    for piece in pieces:
        text = piece.name if isinstance(piece, CallStart) else piece.text
        assert text or isinstance(piece, CallStart), "no empty pieces"
        text.encode()  # no lone surrogate: every piece can be sent as UTF-8
    return accumulate(pieces, reader.called)


def splits(text: str, rng: random.Random, count: int = 20) -> list[list[str]]:
    """Ways to cut `text` into pieces: whole, one character at a time, at every single point
    (short texts), and `count` random cuts."""
    ways = [[text], list(text)]
    if len(text) <= 80:
        ways += [[text[:i], text[i:]] for i in range(1, len(text))]
    for _ in range(count if len(text) > 1 else 0):
        cuts = sorted(rng.sample(range(1, len(text)), min(len(text) - 1, rng.randint(1, 12))))
        ways.append([text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)])
    return ways


def check(text: str, rng: random.Random) -> Accumulated:
    """Every split gives the same result; return it."""
    whole = stream([text])
    for parts in splits(text, rng):
        assert stream(parts) == whole, parts
    return whole


# --- answers that are calls: streamed == parse_tool_calls on the whole text -----------------------

CALLS = [
    '{"name": "get_weather", "arguments": {"city": "Paris"}}',
    ' \n {"name":"get_weather","arguments":{"city":"Paris"}} \n',
    (
        '{\n  "name": "f",\n  "arguments": {\n    "a": [1, 2.50, -0, 1E+2, 1e400, true, false, '
        "null]\n  }\n}"
    ),
    '{"arguments": {"b": {"c": []}}, "name": "f"}',
    '{"name": "f", "id": 7, "extra": {"x": [1, "}"]}, "arguments": {}}',
    '{"name": "f", "parameters": {"q": "x"}}',
    '{"name": "f", "arguments": "{\\"city\\": \\"Paris\\"}"}',
    '{"name": "  padded  ", "arguments": {}}',
    (
        '{"name": "f", "arguments": {"s": "tab\\there \\"quoted\\" back\\\\slash \\/ '
        '\\u00e9 é \\ud83d\\ude00"}}'
    ),
    (
        '{"name": "f", "arguments": {"lone": "\\ud800", "then": "\\ud800\\n", '
        '"two": "\\udbff\\udbff"}}'
    ),
    '{"name": "f", "arguments": {"n": NaN, "i": -Infinity, "j": Infinity}}',
    '{"na\\u006de": "f", "arguments": {"k\\u00e9y": 1}}',
    '{"name": "f", "arguments": {}}\n{"name": "g", "arguments": {"x": 1}}',
    '{"name": "f", "arguments": {}};{"name": "g", "arguments": {}} ; ',
    '[{"name": "f", "arguments": {}}, {"name": "g", "arguments": {"y": [{}]}}]',
    '[ {"name": "f", "arguments": {}} ] {"name": "g", "arguments": {}}',
    '<|python_tag|>{"name": "f", "arguments": {"a": 1}}',
    '<|python_tag|> ```json\n{"name": "f", "arguments": {"a": 1}}\n```',
    '```json\n{"name": "f", "arguments": {"a": 1}}\n```\n',
    '```\n[{"name": "f", "arguments": {}}]\n```',
    '<tool_call>\n{"name": "f", "arguments": {"a": 1}}\n</tool_call>',
    '[TOOL_CALLS] [{"name": "f", "arguments": {"a": 1}}]',
    '[TOOL_CALLS]f[ARGS]{"a": 1}',
    'Action: f\nAction Input: {"a": 1}',
]


@pytest.mark.parametrize("text", CALLS)
def test_calls_stream_as_the_whole_text_parses(text: str) -> None:
    expected = parse_tool_calls(text)
    assert expected is not None, "the case must be a call"
    assert check(text, random.Random(text)) == Accumulated("", expected, called=True)


# --- answers that are text: streamed verbatim, no call --------------------------------------------

TEXTS = [
    "Hello there!",
    "   leading whitespace, then text",
    "",
    " \n ",
    '{"answer": 42}',
    '{"name": "Bob", "age": 3}',
    '{"name": 5, "arguments": {}}',
    '{"name": "", "arguments": {}}',
    '{"name": "f", "arguments": 5}',
    '{"name": "f", "arguments": "[1]"}',
    '{"name": "f", "arguments": "not json"}',
    '{"arguments": {"a": 1}}',
    "{name: 'f'}",
    '{"name": "f" "arguments": {}}',
    "[]",
    "[1, 2]",
    '[{"name": "f"}]',
    "<|python_tag|>hello",
    "```python\nprint(1)\n```",
    "``` json\n{}",
    "<b>bold</b>",
    "Actually, no.",
    "[TOOLS are great]",
    '{"name": "f\n", "arguments": {}}',
]


@pytest.mark.parametrize("text", TEXTS)
def test_text_streams_verbatim(text: str) -> None:
    assert parse_tool_calls(text) is None, "the case must be text"
    assert check(text, random.Random(text)) == Accumulated(text, [], called=False)


# --- where streaming must decide before the end (module docstring) --------------------------------

DIVERGING = [
    (
        "text after a call follows as content",
        '{"name": "f", "arguments": {"a": 1}}\nI called f.',
        Accumulated("\nI called f.", [ToolCall("f", '{"a": 1}')], called=True),
    ),
    (
        "a second object that is no call follows as content",
        '{"name": "f", "arguments": {}} {"x": 1}',
        Accumulated(' {"x": 1}', [ToolCall("f", "{}")], called=True),
    ),
    (
        "a call broken off keeps what was sent; the rest is content",
        '{"name": "f", "arguments": {"a": 1, "b": tru}} more',
        Accumulated(" tru}} more", [ToolCall("f", '{"a": 1, "b": ')], called=False),
    ),
    (
        "a number JSON does not allow breaks a call",
        '{"name": "f", "arguments": {"a": 01}}',
        Accumulated(" 01}}", [ToolCall("f", '{"a": ')], called=False),
    ),
    (
        "a call cut short (max_tokens) is unfinished",
        '{"name": "f", "arguments": {"city": "Par',
        Accumulated("", [ToolCall("f", '{"city": "Par')], called=False),
    ),
    (
        "a marker after leading text is not looked for",
        'Sure.\n<tool_call>{"name": "f", "arguments": {}}</tool_call>',
        Accumulated('Sure.\n<tool_call>{"name": "f", "arguments": {}}</tool_call>', []),
    ),
    (
        "the first name counts",
        '{"name": "f", "arguments": {}, "name": "g"}',
        Accumulated("", [ToolCall("f", "{}")], called=True),
    ),
]


@pytest.mark.parametrize(
    ("text", "expected"), [case[1:] for case in DIVERGING], ids=[case[0] for case in DIVERGING]
)
def test_decisions_before_the_end(text: str, expected: Accumulated) -> None:
    assert check(text, random.Random(text)) == expected


# --- generated calls ------------------------------------------------------------------------------

_CHARS = [
    "a",
    "Z",
    " ",
    '"',
    "\\",
    "/",
    "\n",
    "\t",
    "\x01",
    "é",
    "€",
    "😀",
    "\u2028",
    "}",
    "{",
    ",",
]


def random_value(rng: random.Random, depth: int = 0) -> Any:
    kind = rng.choice(["str", "int", "float", "bool", "null"] + ["list", "dict"] * (depth < 3))
    if kind == "str":
        return random_string(rng)
    if kind == "int":
        return rng.choice([0, -1, 7, 2**70, -(10**20)])
    if kind == "float":
        return rng.choice([0.5, -2.25, 1e-7, 1.5e300, 123456.789, -0.0])
    if kind == "bool":
        return rng.random() < 0.5
    if kind == "null":
        return None
    if kind == "list":
        return [random_value(rng, depth + 1) for _ in range(rng.randint(0, 3))]
    return {random_string(rng): random_value(rng, depth + 1) for _ in range(rng.randint(0, 3))}


def random_string(rng: random.Random) -> str:
    return "".join(rng.choice(_CHARS) for _ in range(rng.randint(0, 8)))


def random_json(rng: random.Random, value: Any) -> str:
    """`value` as JSON in a random layout: indents, separators, \\u escapes or raw text."""
    return json.dumps(
        value,
        ensure_ascii=rng.random() < 0.5,
        indent=rng.choice([None, 0, 2]),
        separators=rng.choice([None, (",", ":"), (" , ", " :  ")]),
    )


def random_call_text(rng: random.Random) -> tuple[str, list[tuple[str, Any]]]:
    """An answer of one to three calls in a random layout, and the calls it holds."""
    calls = []
    objects = []
    for _ in range(rng.randint(1, 3)):
        name = rng.choice(["get_weather", "now", "a.b-c", "é"])
        arguments = {random_string(rng): random_value(rng, 1) for _ in range(rng.randint(0, 4))}
        calls.append((name, arguments))
        key = rng.choice(["arguments", "parameters"])
        members = [("name", name), (key, arguments)]
        if rng.random() < 0.3:
            members.reverse()
        if rng.random() < 0.2:
            members.insert(rng.randint(0, 2), ("id", random_value(rng, 1)))
        if rng.random() < 0.2:
            members = [(k, json.dumps(v) if k == key else v) for k, v in members]
        objects.append(random_json(rng, dict(members)))
    if rng.random() < 0.3:
        body = "[" + rng.choice([",", ", ", ",\n"]).join(objects) + "]"
    else:
        body = rng.choice(["\n", " ; ", "\n\n", ";"]).join(objects)
    lead = rng.choice(["", " ", "\n", "<|python_tag|>", "```json\n", "<|python_tag|>```\n"])
    tail = "\n```" if "```" in lead else rng.choice(["", "\n", " "])
    return lead + body + tail, calls


@pytest.mark.parametrize("seed", range(100))
def test_generated_calls(seed: int) -> None:
    rng = random.Random(seed)
    text, calls = random_call_text(rng)
    expected = parse_tool_calls(text)
    assert expected is not None
    assert [(c.name, json.loads(c.arguments)) for c in expected] == calls
    assert check(text, rng) == Accumulated("", expected, called=True)


# --- early: text at once, arguments as they come --------------------------------------------------


def released_by_prefix(text: str) -> list[Accumulated]:
    """What has been released after each character of `text` (fed one at a time)."""
    reader = ToolCallStream()
    pieces: list[Piece] = []
    seen = []
    for char in text:
        pieces += reader.feed(char)
        seen.append(accumulate(list(pieces)))
    return seen


@pytest.mark.parametrize(
    ("text", "decided_at"),
    [
        ("Hello", 0),
        ("  Hi", 2),
        ("{x", 1),
        ('{"name": 5', 9),
        ('{"name": "f", "arguments": 5', 27),
        ('{"a": 1}', 7),
        ("<|python_tag|>x", 14),
        ("<tox", 3),
        ("```py\nx", 6),
        ("[1", 1),
        ("Actu", 3),
    ],
)
def test_text_is_released_when_it_cannot_be_a_call(text: str, decided_at: int) -> None:
    seen = released_by_prefix(text)
    assert [s.content for s in seen[:decided_at]] == [""] * decided_at, "held while undecided"
    assert seen[decided_at].content == text[: decided_at + 1], "released at once"


@pytest.mark.parametrize("seed", range(20))
def test_arguments_stream_as_they_are_generated(seed: int) -> None:
    rng = random.Random(seed)
    value = "".join(rng.choice(_CHARS) for _ in range(30))
    ascii_only = rng.random() < 0.5
    head = '{"name": "f", "arguments": {"text": "'
    raw = [json.dumps(char, ensure_ascii=ascii_only)[1:-1] for char in value]  # as generated
    seen = released_by_prefix(head + "".join(raw) + '"}}')
    start = len('{"name": "f", "arguments": {') - 1
    assert not seen[start - 1].calls, "no call before its arguments start"
    assert seen[start].calls == [ToolCall("f", "{")]
    for count in range(len(value) + 1):  # each character goes out as soon as it is complete
        position = len(head) + len("".join(raw[:count])) - 1
        sent = '{"text": "' + json.dumps(value[:count], ensure_ascii=False)[1:-1]
        assert seen[position].calls == [ToolCall("f", sent)]
    assert seen[-1].calls == [ToolCall("f", json.dumps({"text": value}, ensure_ascii=False))]


def test_a_call_starts_when_its_name_and_arguments_are_known() -> None:
    seen = released_by_prefix('{"arguments": {"a": [1, 2]}, "name": "f"}')
    first = next(i for i, s in enumerate(seen) if s.calls)
    assert first == len('{"arguments": {"a": [1, 2]}, "name": "f"') - 1
    assert seen[first].calls == [ToolCall("f", '{"a": [1, 2]}')]
