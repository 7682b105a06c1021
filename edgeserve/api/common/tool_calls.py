"""Tool calls parsed out of generated text, for the common chat-template families.

Pure text processing: no engine, no HTTP, no wire models. `parse_tool_calls(text)` returns the
calls in order, or None when the text is a plain answer — including when it looks like a tool
call but does not parse (malformed JSON, a missing name, non-object arguments), so a broken
call reaches the client as content instead of being lost.

Families, tried in this order (the first whose marker appears decides; no fall-through):

  Hermes / Qwen    <tool_call>{"name": ..., "arguments": {...}}</tool_call>   (one or more;
                   text around the blocks is dropped, a last block may lack its end tag)
  Mistral          [TOOL_CALLS] [{"name": ..., "arguments": {...}}, ...]
                   [TOOL_CALLS]name[ARGS]{...}  (the v11 tokenizer's form, repeatable)
  LlamaFactory     Action: name\\nAction Input: {json}   (the reference's default template;
                   repeatable; as its `tool_extractor`, any JSON value is accepted as input)
  JSON             {"name": ..., "arguments"|"parameters": {...}}: Llama 3 (optionally after
                   <|python_tag|>) and edgeserve's generic TOOLS_PREAMBLE format; also a JSON
                   array of such objects, or several objects separated by `;` or whitespace,
                   and one surrounding ``` code fence.

Every call needs a non-empty string `name` and (except in the LlamaFactory format) an
`arguments` (or `parameters`) JSON object, or a string holding one. `arguments` is returned as
a JSON string (`json_text`: `json.dumps(value, ensure_ascii=False)`), ready for OpenAI's
`function.arguments`. (`edgeserve.tool_stream` reads the JSON family while an answer streams.)
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Final

HERMES_OPEN: Final = "<tool_call>"
HERMES_CLOSE: Final = "</tool_call>"
MISTRAL_TAG: Final = "[TOOL_CALLS]"
PYTHON_TAG: Final = "<|python_tag|>"

_HERMES_BLOCK: Final = re.compile(r"<tool_call>(.*?)(?:</tool_call>|\Z)", re.DOTALL)
_ACTION: Final = re.compile(
    r"Action:\s*([a-zA-Z0-9_]+)\s*Action Input:\s*(.+?)(?=\s*Action:|\s*$)", re.DOTALL
)
_MISTRAL_ARGS: Final = re.compile(
    r"\s*([A-Za-z0-9_.\-]+)\s*(?:\[CALL_ID\]\s*[A-Za-z0-9]+\s*)?\[ARGS\]\s*", re.DOTALL
)
_FENCE: Final = re.compile(r"\A```[A-Za-z0-9_-]*\s*\n?(.*?)\n?\s*```\Z", re.DOTALL)
_DECODER: Final = json.JSONDecoder()
_SURROGATE: Final = re.compile("[\ud800-\udfff]")


@dataclass(frozen=True)
class ToolCall:
    """One parsed call: the function name and its arguments as a JSON string."""

    name: str
    arguments: str


def parse_tool_calls(text: str) -> list[ToolCall] | None:
    """The tool calls in `text` (at least one), or None when it is a plain answer."""
    if HERMES_OPEN in text:
        return _hermes(text)
    if MISTRAL_TAG in text:
        return _mistral(text)
    if _ACTION.search(text):
        return _action(text)
    return _json_calls(text)


def _hermes(text: str) -> list[ToolCall] | None:
    calls: list[ToolCall] = []
    for block in _HERMES_BLOCK.findall(text):
        value = _loads(block.strip())
        call = _call_from_object(value, ("arguments", "parameters"))
        if call is None:
            return None
        calls.append(call)
    return calls or None


def _mistral(text: str) -> list[ToolCall] | None:
    body = text.split(MISTRAL_TAG, 1)[1]
    if body.lstrip().startswith(("[", "{")):
        return _json_calls(body)
    calls: list[ToolCall] = []
    for part in body.split(MISTRAL_TAG):
        position = 0
        while position < len(part.rstrip()):
            match = _MISTRAL_ARGS.match(part, position)
            if match is None:
                return None
            decoded = _raw_decode(part, match.end())
            if decoded is None:
                return None
            value, position = decoded
            arguments = _arguments(value)
            if arguments is None:
                return None
            calls.append(ToolCall(match.group(1), arguments))
    return calls or None


def _action(text: str) -> list[ToolCall] | None:
    """The reference's DefaultToolUtils.tool_extractor, kept to its accepted inputs."""
    calls = []
    for name, raw in _ACTION.findall(text):
        value = _loads(raw.strip().strip('"').strip("`"))
        if value is _INVALID:
            return None
        calls.append(ToolCall(clean_name(name), json_text(value)))
    return calls or None


def _json_calls(text: str) -> list[ToolCall] | None:
    body = text.strip()
    if body.startswith(PYTHON_TAG):
        body = body[len(PYTHON_TAG) :].strip()
    fenced = _FENCE.match(body)
    if fenced:
        body = fenced.group(1).strip()
    if not body.startswith(("{", "[")):
        return None
    values = _json_sequence(body)
    if values is None:
        return None
    items: list[Any] = []
    for value in values:
        items.extend(value if isinstance(value, list) else [value])
    calls = [_call_from_object(item, ("arguments", "parameters")) for item in items]
    if not calls or any(call is None for call in calls):
        return None
    return [call for call in calls if call is not None]


def _json_sequence(body: str) -> list[Any] | None:
    """Every JSON value in `body`, separated by whitespace or `;`; None if anything else."""
    values = []
    position = 0
    while True:
        decoded = _raw_decode(body, position)
        if decoded is None:
            return None
        value, position = decoded
        values.append(value)
        rest = body[position:].lstrip()
        if rest.startswith(";"):
            rest = rest[1:].lstrip()
        if not rest:
            return values
        position = len(body) - len(rest)


def _call_from_object(value: Any, argument_keys: tuple[str, ...]) -> ToolCall | None:
    if not isinstance(value, dict):
        return None
    name = value.get("name")
    if not isinstance(name, str) or not name.strip():
        return None
    present = [key for key in argument_keys if key in value]
    if not present:
        return None
    arguments = _arguments(value[present[0]])
    if arguments is None:
        return None
    return ToolCall(clean_name(name), arguments)


def _arguments(raw: Any) -> str | None:
    """A JSON object, or a string holding one, as a JSON string; None for anything else."""
    if isinstance(raw, str):
        raw = _loads(raw)
    if not isinstance(raw, dict):
        return None
    return json_text(raw)


def json_text(value: Any) -> str:
    """`value` as `json.dumps(value, ensure_ascii=False)` writes it, except that a lone UTF-16
    surrogate (the model may write `"\\ud800"`) stays a `\\u` escape: raw, it has no UTF-8."""
    return _SURROGATE.sub(
        lambda match: f"\\u{ord(match.group(0)):04x}", json.dumps(value, ensure_ascii=False)
    )


def clean_name(name: str) -> str:
    """A function name as returned: stripped, lone surrogates replaced (they have no UTF-8)."""
    return _SURROGATE.sub("\ufffd", name.strip())


class _Invalid:
    __slots__ = ()


_INVALID: Final = _Invalid()


def _raw_decode(text: str, position: int) -> tuple[Any, int] | None:
    """The JSON value at `position` and where it ends; None for text that is not JSON, nests
    too deeply, or holds an integer of more digits than Python converts (a ValueError)."""
    try:
        return _DECODER.raw_decode(text, position)
    except (ValueError, RecursionError):
        return None


def _loads(text: str) -> Any:
    """`text` as JSON; _INVALID where `_raw_decode` gives None."""
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        return _INVALID
