"""The incremental JSON readers under `tool_stream`: a JSON value and a tool call object, read a
character at a time.

`JsonValue` writes the value as it reads it, as `json_text` writes the parsed value (whitespace
dropped, `", "` and `": "` separators, strings re-escaped, numbers as Python writes them), so a
call's arguments can stream while they are generated. `CallObject` reads one
`{"name": ..., "arguments": {...}}` object (`parameters` for `arguments`, keys in any order, other
keys ignored; with duplicate keys the first "name" and the first of "arguments"/"parameters"
count). Both raise `Broken` as soon as the text read can no longer be what they expect.
"""

from __future__ import annotations

import json
import re
from typing import Final

from edgeserve.api.common.tool_calls import clean_name, json_text

SPACE: Final = frozenset(" \t\n\r")
_NUMBER_CHARS: Final = frozenset("0123456789+-.eE")
_NUMBER: Final = re.compile(r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][-+]?[0-9]+)?")
_LITERALS: Final = ("true", "false", "null", "NaN", "Infinity", "-Infinity")
_HEX: Final = frozenset("0123456789abcdefABCDEF")
_SIMPLE_ESCAPES: Final = frozenset('"\\/bfnrt')


class Broken(Exception):
    """The text read so far can no longer be what the reader expects."""


class JsonValue:
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
        before it (a number ends only at what follows it). Broken if the text is not JSON."""
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
                raise Broken(self._token)
            self._scalar()
            return self.feed(char)
        elif state == "literal":
            self._literal(char)
        elif char in SPACE:
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
            raise Broken(char)
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
            raise Broken(char)

    def _key_start(self, char: str, state: str) -> None:
        if char == '"':
            self._open_string(key=True)
        elif char == "}" and state == "key":
            self._close(char)
        else:
            raise Broken(char)

    def _after(self, char: str) -> None:
        if char == ",":
            self.out.append(", ")
            self._state = "next-key" if self._stack[-1] == "{" else "value"
        elif char == {"{": "}", "[": "]"}[self._stack[-1]]:
            self._close(char)
        else:
            raise Broken(char)

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
            raise Broken(self._token)

    def _scalar(self) -> None:
        """Write the finished number or literal as Python writes its value; Broken for an
        integer of more digits than Python converts (as parse_tool_calls refuses it)."""
        try:
            value = json.loads(self._token)
        except ValueError as exc:
            raise Broken(self._token) from exc
        self.out.append(json.dumps(value))
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
                raise Broken(char)
        elif char not in _HEX:
            raise Broken(char)
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
            raise Broken(self._token) from exc
        self.out.append(json_text(text)[1:-1])
        self._token = ""


class CallObject:
    """One `{"name": ..., "arguments": {...}}` object read a character at a time.

    `name` is set once read. The arguments' text accumulates (take it with `take_arguments`);
    `arguments_started` says whether it may be sent: the arguments began as an object, or were
    a string holding one that has been read. `feed` raises Broken when the object cannot be a
    call; `done` is set when it closed as one.
    """

    def __init__(self) -> None:
        self._state = "open"
        self._member = JsonValue()  # the key or value being read
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
        elif char in SPACE:
            pass
        elif state == "open" and char == "{":
            self._state = "first-key"
        elif state in ("first-key", "next-key") and char == '"':
            self._member = JsonValue()
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
            raise Broken(char)

    def take_arguments(self) -> str:
        """The arguments' text read since the last take."""
        text = "".join(self._arguments)
        self._arguments.clear()
        return text

    def _start_value(self, char: str) -> None:
        key = json.loads(self._member.take())
        if key == "name" and self.name is None:
            if char != '"':
                raise Broken(char)
            self._role = "name"
        elif key in ("arguments", "parameters") and not self._has_arguments:
            if char not in '{"':
                raise Broken(char)
            self._has_arguments = True
            self._role = "arguments" if char == "{" else "string-arguments"
            self.arguments_started = char == "{"
        else:
            self._role = "other"
        self._member = JsonValue()
        self._state = "value"
        self.feed(char)

    def _collect(self) -> None:
        if self._role == "arguments":
            self._arguments.append(self._member.take())

    def _value_done(self) -> None:
        if self._role == "name":
            name = json.loads(self._member.take())
            if not isinstance(name, str) or not name.strip():
                raise Broken("name")
            self.name = clean_name(name)
        elif self._role == "string-arguments":
            try:
                arguments = json.loads(json.loads(self._member.take()))
            except (ValueError, RecursionError) as exc:
                raise Broken("arguments") from exc
            if not isinstance(arguments, dict):
                raise Broken("arguments")
            self._arguments.append(json_text(arguments))
            self.arguments_started = True
        self._state = "after"

    def _after(self, char: str) -> None:
        if char in SPACE:
            return
        if char == ",":
            self._state = "next-key"
        elif char == "}":
            self._close()
        else:
            raise Broken(char)

    def _close(self) -> None:
        if self.name is None or not self.arguments_started:
            raise Broken("}")
        self._state, self.done = "done", True
