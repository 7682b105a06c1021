"""Reading an SSE response the way a strict client does (helpers for the tests)."""

from __future__ import annotations

import json
from typing import Any


def parse_events(raw: bytes) -> tuple[list[Any], bool]:
    """Split a whole SSE body into decoded `data:` payloads; True when it ended in [DONE]."""
    text = raw.decode("utf-8")
    assert text.endswith("\n\n"), "every event ends with a blank line"
    events: list[Any] = []
    done = False
    for block in text.split("\n\n")[:-1]:
        if block.startswith(":"):
            continue
        assert block.startswith("data: "), block
        payload = block[len("data: ") :]
        assert not done, "nothing may follow [DONE]"
        if payload == "[DONE]":
            done = True
        else:
            events.append(json.loads(payload))
    return events, done


def stream_text(events: list[Any]) -> str:
    """Concatenate the content deltas of choice 0."""
    return "".join(e["choices"][0]["delta"].get("content", "") for e in events if e.get("choices"))


def finished_stream(raw: bytes) -> tuple[list[Any], str]:
    """The events of a chat or completions stream that ran to its end: no error event, the
    last choice chunk carries a finish_reason, then [DONE] (an error event is followed by
    [DONE] as well). Returns the events and that finish_reason."""
    events, done = parse_events(raw)
    assert done, "the stream did not end with [DONE]"
    errors = [event for event in events if "error" in event]
    assert not errors, f"the stream ended with an error: {errors}"
    with_choices = [event for event in events if event.get("choices")]
    assert with_choices, "the stream carried no choice"
    reason = with_choices[-1]["choices"][-1].get("finish_reason")
    assert reason is not None, "the last choice chunk has no finish_reason"
    return events, reason
