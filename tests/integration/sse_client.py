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
