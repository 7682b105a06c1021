"""Tool calls read while an answer streams, as OpenAI's `delta.tool_calls` pieces.

`ToolCallStream` is fed the answer's text as the engine releases it, and returns what to send:

    Content(text)               answer text, released as soon as the answer cannot be a call
    CallStart(index, name)      a call begins (OpenAI's first chunk of a call: id, type, name)
    CallArguments(index, text)  the next piece of that call's `arguments` JSON text

It reads the JSON family of `edgeserve.tool_calls` (edgeserve's TOOLS_PREAMBLE format, which a
forced call's grammar also produces, and Llama 3's): `{"name": ..., "arguments": {...}}` objects
(`parameters` for `arguments`, keys in any order, other keys ignored), one or several separated
by whitespace or `;`, or a JSON array of them, optionally after `<|python_tag|>` and inside one
``` fence. While undecided, text is held back. A call starts once its name and the `{` of its
arguments have been read; from then on its arguments stream as they are generated, written as
`json_text` writes the parsed value (whitespace dropped, `", "` and `": "` separators, strings
re-escaped, numbers as Python writes them), so the pieces add up to the `arguments` that
`parse_tool_calls` returns for the whole answer. An answer that starts with another family's
marker (`<tool_call>`, `[TOOL_CALLS]`, `Action:`) is held whole and parsed by `parse_tool_calls`
at the end.

Streaming decides before the end, so it differs from `parse_tool_calls` on the whole text in
these ways: an answer is a call only when it starts as one (after whitespace); text after
complete calls is sent as Content (the whole answer would be content); a call the model breaks
off keeps what was sent, and the rest of the answer follows as Content; with duplicate keys, the
first "name" and the first of "arguments"/"parameters" count.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Final

from edgeserve.api.common.tool_calls import (
    HERMES_OPEN,
    MISTRAL_TAG,
    PYTHON_TAG,
    clean_name,
    json_text,
    parse_tool_calls,
)


@dataclass(frozen=True)
class Content:
    """Answer text."""

    text: str


@dataclass(frozen=True)
class CallStart:
    """Call `index` begins: its name is known and its arguments follow."""

    index: int
    name: str


@dataclass(frozen=True)
class CallArguments:
    """The next piece of call `index`'s arguments JSON text."""

    index: int
    text: str


Piece = Content | CallStart | CallArguments

FENCE: Final = "```"
ACTION: Final = "Action:"
_WHOLE_MARKERS: Final = (HERMES_OPEN, MISTRAL_TAG, ACTION)
_SPACE: Final = frozenset(" \t\n\r")
_LANGUAGE: Final = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-")
_NUMBER_CHARS: Final = frozenset("0123456789+-.eE")
_NUMBER: Final = re.compile(r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][-+]?[0-9]+)?")
_LITERALS: Final = ("true", "false", "null", "NaN", "Infinity", "-Infinity")
_HEX: Final = frozenset("0123456789abcdefABCDEF")
_SIMPLE_ESCAPES: Final = frozenset('"\\/bfnrt')


class _Broken(Exception):
    """The text read so far can no longer be what the reader expects."""


class _JsonValue:
    """One JSON value read a character at a time, written out as `json_text` would write the
    parsed value. Its text accumulates in `out`; `done` is set once the value is complete."""

    def __init__(self) -> None:
        self._stack: list[str] = []  # open containers: "{" or "["
        self._state = "value"
        self._token = ""  # a number or literal being read, or a string's text not yet written
        self._escape = 0  # in a string: 0 none, 1 after "\", 2 + hex digits read in "\uXXXX"
        self._high = False  # the string's last escape was a high surrogate (pairs are joined)
        self._key = False  # the string being read is an object key
        self.out: list[str] = []
        self.done = False

    def feed(self, char: str) -> bool:
        """Read one character. False when it does not belong to the value, which ended just
        before it (a number ends only at what follows it). _Broken if the text is not JSON."""
        if self.done:
            return False
        state = self._state
        if state == "string":
            self._string(char)
        elif state == "number" and char in _NUMBER_CHARS:
            self._token += char
        elif state == "number" and self._token == "-" and char == "I":
            self._state, self._token = "literal", "-I"
        elif state == "number":
            if not _NUMBER.fullmatch(self._token):
                raise _Broken(self._token)
            self._scalar()
            return self.feed(char)
        elif state == "literal":
            self._literal(char)
        elif char in _SPACE:
            pass
        elif state in ("value", "first"):
            self._value(char, state)
        elif state in ("key", "next-key"):
            self._key_start(char, state)
        elif state == "colon" and char == ":":
            self.out.append(": ")
            self._state = "value"
        elif state == "after":
            self._after(char)
        else:
            raise _Broken(char)
        return True

    def take(self) -> str:
        """The text written since the last take."""
        text = "".join(self.out)
        self.out.clear()
        return text

    def _value(self, char: str, state: str) -> None:
        if char == "]" and state == "first":
            self._close(char)
        elif char in "{[":
            self._stack.append(char)
            self.out.append(char)
            self._state = "key" if char == "{" else "first"
        elif char == '"':
            self._open_string(key=False)
        elif char == "-" or (char.isascii() and char.isdigit()):
            self._state, self._token = "number", char
        elif any(literal.startswith(char) for literal in _LITERALS):
            self._state, self._token = "literal", char
        else:
            raise _Broken(char)

    def _key_start(self, char: str, state: str) -> None:
        if char == '"':
            self._open_string(key=True)
        elif char == "}" and state == "key":
            self._close(char)
        else:
            raise _Broken(char)

    def _after(self, char: str) -> None:
        if char == ",":
            self.out.append(", ")
            self._state = "next-key" if self._stack[-1] == "{" else "value"
        elif char == {"{": "}", "[": "]"}[self._stack[-1]]:
            self._close(char)
        else:
            raise _Broken(char)

    def _close(self, char: str) -> None:
        self._stack.pop()
        self.out.append(char)
        self._ended()

    def _ended(self) -> None:
        if self._stack:
            self._state = "after"
        else:
            self._state, self.done = "done", True

    def _literal(self, char: str) -> None:
        self._token += char
        if self._token in _LITERALS:
            self._scalar()
        elif not any(literal.startswith(self._token) for literal in _LITERALS):
            raise _Broken(self._token)

    def _scalar(self) -> None:
        """Write the finished number or literal as Python writes its value."""
        self.out.append(json.dumps(json.loads(self._token)))
        self._token = ""
        self._ended()

    def _open_string(self, *, key: bool) -> None:
        self.out.append('"')
        self._state, self._token, self._key = "string", "", key

    def _string(self, char: str) -> None:
        if self._escape == 0 and char == '"':
            self._write_string()
            self.out.append('"')
            if self._key:
                self._state = "colon"
            else:
                self._ended()
            return
        self._token += char
        if self._escape == 0:
            self._escape = 1 if char == "\\" else 0
            self._high = self._high and char == "\\"
        elif self._escape == 1:
            if char == "u":
                self._escape = 2
            elif char in _SIMPLE_ESCAPES:
                self._escape, self._high = 0, False
            else:
                raise _Broken(char)
        elif char not in _HEX:
            raise _Broken(char)
        elif self._escape < 5:
            self._escape += 1
        else:
            self._escape = 0
            self._high = 0xD800 <= int(self._token[-4:], 16) <= 0xDBFF
        if self._escape == 0 and not self._high:
            self._write_string()

    def _write_string(self) -> None:
        """Write the string text read so far (whole characters and escapes; a high surrogate
        waits for the low one that may follow)."""
        if not self._token:
            return
        try:
            text = json.loads(f'"{self._token}"')
        except json.JSONDecodeError as exc:  # a raw control character
            raise _Broken(self._token) from exc
        self.out.append(json_text(text)[1:-1])
        self._token = ""


class _CallObject:
    """One `{"name": ..., "arguments": {...}}` object read a character at a time.

    `name` is set once read. The arguments' text accumulates (take it with `take_arguments`);
    `arguments_started` says whether it may be sent: the arguments began as an object, or were
    a string holding one that has been read. `feed` raises _Broken when the object cannot be a
    call; `done` is set when it closed as one.
    """

    def __init__(self) -> None:
        self._state = "open"
        self._member = _JsonValue()  # the key or value being read
        self._role = ""  # what the value being read is: name, arguments, string-arguments, other
        self._has_arguments = False
        self._arguments: list[str] = []
        self.name: str | None = None
        self.arguments_started = False
        self.done = False

    def feed(self, char: str) -> None:
        """Read one character of the object (from its `{`)."""
        state = self._state
        if state == "key":
            self._member.feed(char)
            if self._member.done:
                self._state = "colon"
        elif state == "value":
            if self._member.feed(char):
                self._collect()
                if self._member.done:
                    self._value_done()
            else:
                self._value_done()
                self._after(char)
        elif char in _SPACE:
            pass
        elif state == "open" and char == "{":
            self._state = "first-key"
        elif state in ("first-key", "next-key") and char == '"':
            self._member = _JsonValue()
            self._member.feed(char)
            self._state = "key"
        elif state == "first-key" and char == "}":
            self._close()
        elif state == "colon" and char == ":":
            self._state = "value-start"
        elif state == "value-start":
            self._start_value(char)
        elif state == "after":
            self._after(char)
        else:
            raise _Broken(char)

    def take_arguments(self) -> str:
        """The arguments' text read since the last take."""
        text = "".join(self._arguments)
        self._arguments.clear()
        return text

    def _start_value(self, char: str) -> None:
        key = json.loads(self._member.take())
        if key == "name" and self.name is None:
            if char != '"':
                raise _Broken(char)
            self._role = "name"
        elif key in ("arguments", "parameters") and not self._has_arguments:
            if char not in '{"':
                raise _Broken(char)
            self._has_arguments = True
            self._role = "arguments" if char == "{" else "string-arguments"
            self.arguments_started = char == "{"
        else:
            self._role = "other"
        self._member = _JsonValue()
        self._state = "value"
        self.feed(char)

    def _collect(self) -> None:
        if self._role == "arguments":
            self._arguments.append(self._member.take())

    def _value_done(self) -> None:
        if self._role == "name":
            name = json.loads(self._member.take())
            if not isinstance(name, str) or not name.strip():
                raise _Broken("name")
            self.name = clean_name(name)
        elif self._role == "string-arguments":
            try:
                arguments = json.loads(json.loads(self._member.take()))
            except (json.JSONDecodeError, RecursionError) as exc:
                raise _Broken("arguments") from exc
            if not isinstance(arguments, dict):
                raise _Broken("arguments")
            self._arguments.append(json_text(arguments))
            self.arguments_started = True
        self._state = "after"

    def _after(self, char: str) -> None:
        if char in _SPACE:
            return
        if char == ",":
            self._state = "next-key"
        elif char == "}":
            self._close()
        else:
            raise _Broken(char)

    def _close(self) -> None:
        if self.name is None or not self.arguments_started:
            raise _Broken("}")
        self._state, self.done = "done", True


class ToolCallStream:
    """One streamed answer read for tool calls. Feed it every piece of text in order, then
    call `finish` once; both return the pieces to send. `called` then says whether the answer
    was tool calls (finish_reason "tool_calls"): at least one call, and none left unfinished.
    """

    def __init__(self) -> None:
        self._state = "lead"
        self._held: list[str] = []  # text not yet released (or, in "whole", the answer)
        self._marker = ""  # the start of a marker read so far
        self._tagged = False  # <|python_tag|> was read
        self._fenced = False  # a ``` fence was opened
        self._language = False  # reading the fence's language name
        self._in_array = False
        self._call: _CallObject | None = None
        self._started = False  # the current call's CallStart was sent
        self._calls = 0
        self._out: list[Piece] = []

    @property
    def called(self) -> bool:
        """Whether the answer so far is complete tool calls (at least one)."""
        return self._calls > 0 and not self._started

    def feed(self, text: str) -> list[Piece]:
        """The pieces that `text`, the answer's next text, releases."""
        for position, char in enumerate(text):
            if self._state == "text":
                self._out.append(Content(text[position:]))
                break
            if self._state == "whole":
                self._held.append(text[position:])
                break
            self._held.append(char)
            try:
                self._read(char)
            except _Broken:
                self._release()
        return self._flush()

    def finish(self) -> list[Piece]:
        """The last pieces, after the answer's last text."""
        held = "".join(self._held)
        if self._state == "whole":
            calls = parse_tool_calls(held)
            if calls is None:
                self._out.append(Content(held))
            for call in calls or ():
                self._out.append(CallStart(self._calls, call.name))
                self._out.append(CallArguments(self._calls, call.arguments))
                self._calls += 1
        elif held and not self._started and (self._calls == 0 or self._state == "call"):
            self._out.append(Content(held))
        self._held.clear()
        return self._flush()

    def _read(self, char: str) -> None:
        """One character outside text: of the lead, a call, or what lies between calls."""
        state = self._state
        if state == "call":
            self._read_call(char)
        elif self._marker:
            self._read_marker(char)
        elif char in _SPACE:
            self._language = False
        elif state == "lead":
            self._read_lead(char)
        elif state in ("between", "semicolon") and char in "{[":
            self._open_value(char)
        elif state == "between" and char == ";":
            self._state = "semicolon"
        elif state in ("between", "semicolon") and self._fenced and char == "`":
            self._marker = char
        elif state in ("array-first", "array-next") and char == "{":
            self._open_value(char)
        elif state == "array-after" and char == ",":
            self._state = "array-next"
        elif state == "array-after" and char == "]":
            self._in_array = False
            self._state = "between"
        else:
            raise _Broken(char)

    def _read_lead(self, char: str) -> None:
        """A character of the lead, after whitespace: a fence's language, a call, an array,
        or the first character of a marker."""
        if self._language and char in _LANGUAGE:
            return
        self._language = False
        markers = self._markers()
        if char == "{" or (char == "[" and MISTRAL_TAG not in markers):
            self._open_value(char)
        elif any(marker.startswith(char) for marker in markers):
            self._marker = char
        else:
            raise _Broken(char)

    def _read_marker(self, char: str) -> None:
        """The next character of a marker (a tag, a fence, another family's start)."""
        text = self._marker + char
        if self._marker == "[" and not MISTRAL_TAG.startswith(text):
            self._marker = ""
            self._open_value("[")
            self._read(char)
            return
        if not any(marker.startswith(text) for marker in self._markers()):
            raise _Broken(text)
        if text not in self._markers():
            self._marker = text
            return
        self._marker = ""
        if text == PYTHON_TAG:
            self._tagged = True
        elif text == FENCE and self._state == "lead":
            self._fenced = self._language = True
        elif text == FENCE:
            self._state = "closed"
        else:
            self._state = "whole"

    def _markers(self) -> tuple[str, ...]:
        """The markers that may come next."""
        if self._state != "lead":
            return (FENCE,) if self._fenced and self._state in ("between", "semicolon") else ()
        if self._fenced:
            return ()
        if self._tagged:
            return (FENCE,)
        return (PYTHON_TAG, FENCE, *_WHOLE_MARKERS)

    def _open_value(self, char: str) -> None:
        if char == "[":
            self._in_array = True
            self._state = "array-first"
            return
        self._call = _CallObject()
        self._state = "call"
        self._read_call(char)

    def _read_call(self, char: str) -> None:
        call = self._call
        assert call is not None
        call.feed(char)
        if not self._started and call.name is not None and call.arguments_started:
            self._started = True
            self._out.append(CallStart(self._calls, call.name))
            self._held.clear()
        arguments = call.take_arguments() if self._started else ""
        if arguments:
            self._out.append(CallArguments(self._calls, arguments))
            self._held.clear()
        if call.done:
            self._calls += 1
            self._started = False
            self._call = None
            self._held.clear()
            self._state = "array-after" if self._in_array else "between"

    def _release(self) -> None:
        """The answer turned out not to be (more) calls: what is held (for a started call, what
        it has read since its last piece) and everything after it goes out as text."""
        self._out.append(Content("".join(self._held)))
        self._held.clear()
        self._state = "text"

    def _flush(self) -> list[Piece]:
        """The pieces produced since the last flush, neighbours of one kind joined, empty
        ones dropped."""
        merged: list[Piece] = []
        for piece in self._out:
            last = merged[-1] if merged else None
            if isinstance(piece, CallStart):
                merged.append(piece)
            elif not piece.text:
                continue
            elif isinstance(piece, Content) and isinstance(last, Content):
                merged[-1] = Content(last.text + piece.text)
            elif (
                isinstance(piece, CallArguments)
                and isinstance(last, CallArguments)
                and last.index == piece.index
            ):
                merged[-1] = CallArguments(piece.index, last.text + piece.text)
            else:
                merged.append(piece)
        self._out.clear()
        return merged
