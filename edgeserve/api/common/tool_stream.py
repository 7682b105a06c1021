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

The character-by-character JSON readers it drives are in `json_scan`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from edgeserve.api.common.json_scan import SPACE, Broken, CallObject
from edgeserve.api.common.tool_calls import (
    HERMES_OPEN,
    MISTRAL_TAG,
    PYTHON_TAG,
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
_LANGUAGE: Final = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-")


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
        self._call: CallObject | None = None
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
            except Broken:
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
        elif char in SPACE:
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
            raise Broken(char)

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
            raise Broken(char)

    def _read_marker(self, char: str) -> None:
        """The next character of a marker (a tag, a fence, another family's start)."""
        text = self._marker + char
        if self._marker == "[" and not MISTRAL_TAG.startswith(text):
            self._marker = ""
            self._open_value("[")
            self._read(char)
            return
        if not any(marker.startswith(text) for marker in self._markers()):
            raise Broken(text)
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
        self._call = CallObject()
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
