"""Ollama's answers: one JSON object (`"stream": false`), or newline-delimited JSON objects,
the last with `done: true`, why it ended and the request's timings in nanoseconds (from the
engine's own figures: the prompt's reading and the answer's decoding, and how long the
request waited for its model to load); errors as `{"error": …}`."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any, Literal

from edgeserve.api.common.call import RequestRecord
from edgeserve.api.common.generating_api import ChoiceAnswer, ChoiceEnd, TokenUsage
from edgeserve.api.common.logprobs import AlignedLogprob, LogprobAligner
from edgeserve.api.common.tool_calls import ToolCall
from edgeserve.api.common.tool_stream import CallArguments, CallStart, Content, Piece
from edgeserve.api.reference.errors import error_message
from edgeserve.engine.types import Finished
from edgeserve.errors import ApiError

NS = 1_000_000_000
Kind = Literal["chat", "generate"]


def line(payload: dict[str, Any]) -> bytes:
    """One JSON object and a newline, compact, raw UTF-8 (unpaired surrogates escaped)."""
    text = json.dumps(payload, ensure_ascii=False, separators=(",", ":"))
    try:
        return (text + "\n").encode()
    except UnicodeEncodeError:
        return (json.dumps(payload, separators=(",", ":")) + "\n").encode()


def json_body(payload: dict[str, Any]) -> bytes:
    """A whole answer: one compact JSON object."""
    return line(payload).rstrip(b"\n")


def error_body(message: str) -> bytes:
    """Ollama's error object."""
    return json_body({"error": message})


def created_at() -> str:
    """Now, as Go writes a UTC time (RFC 3339 with nanoseconds' digits and a Z)."""
    return datetime.now(UTC).isoformat().replace("+00:00", "Z")


def wire_calls(calls: Sequence[tuple[str, Any]]) -> list[dict[str, Any]]:
    """(name, arguments object) pairs as Ollama's `tool_calls`."""
    return [
        {
            "id": f"call_{uuid.uuid4().hex[:8]}",
            "function": {"index": index, "name": name, "arguments": arguments},
        }
        for index, (name, arguments) in enumerate(calls)
    ]


def parsed_calls(calls: Sequence[ToolCall] | None) -> list[tuple[str, Any]] | None:
    """The calls with their arguments as objects; None when there are none or one's arguments
    are not an object (Ollama's arguments are objects: the answer then stays text)."""
    if not calls:
        return None
    parsed = [(call.name, json.loads(call.arguments)) for call in calls]
    return parsed if all(isinstance(args, dict) for _, args in parsed) else None


class OllamaRenderer:
    """One /api/chat or /api/generate answer. With `idle` ("load" or "unload") the request
    ran nothing: its one object (never streamed) says so."""

    def __init__(
        self,
        kind: Kind,
        model: str,
        record: RequestRecord,
        prompt_tokens: int,
        idle: str | None = None,
    ) -> None:
        self._kind = kind
        self._model = model
        self._record = record
        self._prompt_tokens = prompt_tokens
        self._idle = idle
        self._calls: dict[int, list[str]] = {}  # streamed calls: name, then arguments' pieces

    def aligner(self) -> LogprobAligner:
        """Unused: no log-probabilities are sent."""
        return LogprobAligner()

    def body(self, answers: Sequence[ChoiceAnswer], usage: TokenUsage) -> bytes:
        """The whole answer as one object."""
        if not answers:
            return json_body(self._idle_object())
        answer = answers[0]
        assert answer.finished is not None, "every generation ends with Finished"
        calls = parsed_calls(answer.calls) if self._kind == "chat" else None
        payload = self._object("" if calls else answer.text, calls)
        payload |= self._done(answer.finished)
        return json_body(payload)

    def start(self) -> list[bytes]:
        """Nothing: the first object carries the first text."""
        return []

    def pieces(
        self, index: int, pieces: Sequence[Piece], logprobs: list[AlignedLogprob] | None
    ) -> list[bytes]:
        """An object per piece of text; a call's pieces are kept until the answer ends."""
        lines = []
        for piece in pieces:
            if isinstance(piece, Content):
                if piece.text:
                    lines.append(line(self._object(piece.text)))
            elif isinstance(piece, CallStart):
                self._calls[piece.index] = [piece.name]
            elif isinstance(piece, CallArguments):
                self._calls[piece.index].append(piece.text)
        return lines

    def finish(self, end: ChoiceEnd, usage: TokenUsage) -> list[bytes]:
        """The calls (one object, when the answer was calls), then the `done` object."""
        lines = []
        if end.called and self._calls:
            calls = [(parts[0], json.loads("".join(parts[1:]))) for parts in self._calls.values()]
            lines.append(line(self._object("", calls)))
        return [*lines, line(self._object("") | self._done(end.finished))]

    def end(self, usage: TokenUsage) -> list[bytes]:
        """Nothing: the `done` object was the last."""
        return []

    def failure(self, err: ApiError) -> list[bytes]:
        """Ollama's in-stream error object."""
        return [line({"error": error_message(err.detail)})]

    def _object(self, text: str, calls: Sequence[tuple[str, Any]] | None = None) -> dict[str, Any]:
        payload: dict[str, Any] = {"model": self._model, "created_at": created_at()}
        if self._kind == "generate":
            return payload | {"response": text, "done": False}
        message: dict[str, Any] = {"role": "assistant", "content": text}
        if calls:
            message["tool_calls"] = wire_calls(calls)
        return payload | {"message": message, "done": False}

    def _done(self, finished: Finished) -> dict[str, Any]:
        """`done`, why (Ollama says "stop" for a stop or a call, "length" at the budget) and
        the timings."""
        return {
            "done": True,
            "done_reason": "stop" if finished.reason == "stop" else "length",
            "total_duration": round((time.perf_counter() - self._record.started) * NS),
            "load_duration": round(self._record.load_s * NS),
            "prompt_eval_count": self._prompt_tokens,
            "prompt_eval_duration": round(finished.prompt_s * NS),
            "eval_count": finished.completion_tokens,
            "eval_duration": round(finished.decode_s * NS),
        }

    def _idle_object(self) -> dict[str, Any]:
        return self._object("") | {"done": True, "done_reason": self._idle}
