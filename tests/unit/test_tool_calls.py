"""edgeserve.tool_calls: one row per output text, for every template family.

`None` means "a plain answer": the text goes to the client as content.
"""

from __future__ import annotations

import pytest

from edgeserve.api.common.tool_calls import ToolCall, parse_tool_calls

PARIS = ToolCall("get_weather", '{"city": "Paris"}')
EMPTY = ToolCall("now", "{}")

CASES = [
    # --- Hermes / Qwen: <tool_call>{json}</tool_call> -------------------------------------------
    (
        "hermes",
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
        [PARIS],
    ),
    (
        "hermes, several calls",
        '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>\n'
        '<tool_call>{"name": "now", "arguments": {}}</tool_call>',
        [PARIS, EMPTY],
    ),
    (
        "hermes, text around the blocks is dropped",
        'Let me check.\n<tool_call>{"name": "now", "arguments": {}}</tool_call>\n',
        [EMPTY],
    ),
    (
        "hermes, the last end tag may be missing (stopped at it)",
        '<tool_call>\n{"name": "now", "arguments": {}}\n',
        [EMPTY],
    ),
    (
        "hermes, arguments as a JSON string",
        '<tool_call>{"name": "get_weather", "arguments": "{\\"city\\": \\"Paris\\"}"}</tool_call>',
        [PARIS],
    ),
    (
        "hermes, malformed JSON",
        '<tool_call>{"name": "get_weather", "arguments": {"city": "Par</tool_call>',
        None,
    ),
    (
        "hermes, one bad block spoils all",
        '<tool_call>{"name": "now", "arguments": {}}</tool_call><tool_call>oops</tool_call>',
        None,
    ),
    ("hermes, no name", '<tool_call>{"arguments": {}}</tool_call>', None),
    ("hermes, no arguments", '<tool_call>{"name": "now"}</tool_call>', None),
    ("hermes, empty block", "<tool_call></tool_call>", None),
    # --- Mistral: [TOOL_CALLS] ------------------------------------------------------------------
    (
        "mistral array",
        '[TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Paris"}}]',
        [PARIS],
    ),
    (
        "mistral array, two calls with ids",
        '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}, "id": "abc123def"},'
        ' {"name": "now", "arguments": {}, "id": "xyz987uvw"}]',
        [PARIS, EMPTY],
    ),
    (
        "mistral v11 name[ARGS]{json}, repeated",
        '[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}[TOOL_CALLS]now[ARGS]{}',
        [PARIS, EMPTY],
    ),
    (
        "mistral v13 with a call id",
        '[TOOL_CALLS]get_weather[CALL_ID]a1b2c3d4e[ARGS]{"city": "Paris"}',
        [PARIS],
    ),
    ("mistral, malformed array", '[TOOL_CALLS] [{"name": "now", "arguments": {}', None),
    ("mistral v11, malformed arguments", "[TOOL_CALLS]now[ARGS]{oops}", None),
    ("mistral v11, no [ARGS]", '[TOOL_CALLS]now {"a": 1}', None),
    # --- LlamaFactory's default template: Action / Action Input ---------------------------------
    (
        "reference format",
        'Action: get_weather\nAction Input: {"city": "Paris"}',
        [PARIS],
    ),
    (
        "reference format, thought first, two calls, code fence",
        'I need two tools.\nAction: get_weather\nAction Input: {"city": "Paris"}\n'
        "Action: now\nAction Input: ```{}```",
        [PARIS, EMPTY],
    ),
    (
        "reference format keeps any JSON input, as its extractor does",
        "Action: echo\nAction Input: [1, 2]",
        [ToolCall("echo", "[1, 2]")],
    ),
    ("reference format, input not JSON", "Action: now\nAction Input: right away", None),
    # --- Llama 3 JSON / edgeserve's generic format ----------------------------------------------
    ("generic JSON", '{"name": "get_weather", "arguments": {"city": "Paris"}}', [PARIS]),
    (
        "lone surrogate escapes stay escapes in arguments, become U+FFFD in names",
        '{"name": "f\\udc00", "arguments": {"a": "\\ud800x", "b": "\\ud83d\\ude00"}}',
        [ToolCall("f\ufffd", '{"a": "\\ud800x", "b": "😀"}')],
    ),
    (
        "llama 3 parameters",
        ' {"name": "get_weather", "parameters": {"city": "Paris"}}\n',
        [PARIS],
    ),
    (
        "llama 3 after <|python_tag|>",
        '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}',
        [PARIS],
    ),
    (
        "several objects separated by ;",
        '{"name": "get_weather", "parameters": {"city": "Paris"}}; '
        '{"name": "now", "parameters": {}}',
        [PARIS, EMPTY],
    ),
    (
        "a JSON array of calls",
        '[{"name": "get_weather", "arguments": {"city": "Paris"}},'
        ' {"name": "now", "arguments": {}}]',
        [PARIS, EMPTY],
    ),
    (
        "inside a code fence",
        '```json\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n```',
        [PARIS],
    ),
    (
        "non-ASCII arguments stay raw UTF-8",
        '{"name": "get_weather", "arguments": {"city": "Zürich"}}',
        [ToolCall("get_weather", '{"city": "Zürich"}')],
    ),
    ("JSON, malformed", '{"name": "get_weather", "arguments": {"city": "Paris"}', None),
    ("JSON, trailing prose", '{"name": "now", "arguments": {}} and that is all', None),
    ("JSON, leading prose", 'Sure: {"name": "now", "arguments": {}}', None),
    ("JSON, arguments not an object", '{"name": "now", "arguments": [1]}', None),
    ("JSON, arguments a string that is no object", '{"name": "now", "arguments": "soon"}', None),
    ("JSON, empty name", '{"name": " ", "arguments": {}}', None),
    ("JSON, no arguments key", '{"name": "Bob"}', None),
    ("JSON, an ordinary object", '{"city": "Paris"}', None),
    ("JSON, an array of numbers", "[1, 2, 3]", None),
    ("JSON, empty array", "[]", None),
    ("python tag with code", "<|python_tag|>brave_search.call(query='x')", None),
    # --- plain answers ---------------------------------------------------------------------------
    ("plain text", "Hello! How can I help?", None),
    ("empty", "", None),
    ("deep nesting is not a crash", "[" * 100_000, None),
]


@pytest.mark.parametrize(("text", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_parse_tool_calls(text: str, expected: list[ToolCall] | None) -> None:
    assert parse_tool_calls(text) == expected
