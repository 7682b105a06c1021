"""PRODUCT.md 3.1 divergence 6 over HTTP: with `tools`, a stream answers instead of the
reference's 400 "Cannot stream function calls.", in OpenAI's `delta.tool_calls` shape.

A forced call (`tool_choice` "required") is certain to be a call; greedy decoding makes the
streamed answer comparable with the non-streamed one. The tool has no description (optional
here, a 422 at the reference). tests/unit/test_tool_stream.py covers the incremental reader.
"""

from __future__ import annotations

import json
import re
from typing import Any

from tests.conformance.wire import CHAT, chat, post
from tests.integration.sse_client import parse_events

EVENT_TOOL = {
    "type": "function",
    "function": {
        "name": "plan_event",
        "parameters": {
            "type": "object",
            "properties": {
                "title": {"type": "string"},
                "city": {"type": "string"},
                "guests": {"type": "integer"},
            },
            "required": ["title", "city", "guests"],
        },
    },
}
ASK = {"role": "user", "content": "Plan a birthday party in Paris for 12 guests."}
FORCED = chat(ASK, tools=[EVENT_TOOL], tool_choice="required", temperature=0, max_tokens=64)
CALL_ID = re.compile(r"call_[0-9a-f]{32}")


async def answers(client: Any, body: dict[str, Any]) -> tuple[dict[str, Any], list[Any]]:
    """The non-streamed answer and the events of the same request streamed."""
    plain = await post(client, CHAT, body)
    assert plain.status == 200, plain.body
    streamed = await post(client, CHAT, {**body, "stream": True})
    assert streamed.status == 200, streamed.body
    events, done = parse_events(streamed.body)
    assert done
    return plain.json(), events


def deltas(events: list[Any]) -> list[dict[str, Any]]:
    """The deltas of choice 0 after the role chunk, up to the finish chunk (excluded)."""
    choices = [event["choices"][0] for event in events if event["choices"]]
    assert choices[0]["delta"] == {"role": "assistant", "content": ""}
    assert all(choice["finish_reason"] is None for choice in choices[1:-1])
    return [choice["delta"] for choice in choices[1:-1]]


async def test_a_forced_call_streams_as_openai_does(client):
    extra = {"stream_options": {"include_usage": True}, "logprobs": True, "top_logprobs": 2}
    plain, events = await answers(client, {**FORCED, **extra})
    [call] = plain["choices"][0]["message"]["tool_calls"]
    first, *rest = deltas(events)
    assert list(first) == ["tool_calls"]
    [start] = first["tool_calls"]
    assert list(start) == ["index", "id", "type", "function"]
    assert CALL_ID.fullmatch(start["id"])
    assert start == {
        "index": 0,
        "id": start["id"],
        "type": "function",
        "function": {"name": "plan_event", "arguments": ""},
    }
    assert len(rest) > 3, "the arguments come in pieces as they are generated"
    for delta in rest:
        [piece] = delta["tool_calls"]
        assert list(piece) == ["index", "function"] and piece["index"] == 0
        assert list(piece["function"]) == ["arguments"] and piece["function"]["arguments"]
    arguments = "".join(delta["tool_calls"][0]["function"]["arguments"] for delta in rest)
    assert (start["function"]["name"], arguments) == (
        call["function"]["name"],
        call["function"]["arguments"],
    )
    assert set(json.loads(arguments)) == {"title", "city", "guests"}
    finish = dict([event for event in events if event["choices"]][-1]["choices"][0])
    finish.pop("logprobs", None)  # the tokens of the call's closing brace, if no piece had them
    assert finish == {"index": 0, "delta": {}, "finish_reason": "tool_calls"}
    usage = events[-1]["usage"]
    assert events[-1]["choices"] == []
    assert usage["completion_tokens"] == plain["usage"]["completion_tokens"]
    # every token's log-probability is sent, with the event that releases it or a later one
    streamed = [
        entry["token"]
        for event in events
        if event["choices"] and event["choices"][0].get("logprobs")
        for entry in event["choices"][0]["logprobs"]["content"]
    ]
    assert streamed == [entry["token"] for entry in plain["choices"][0]["logprobs"]["content"]]


async def test_a_text_answer_with_tools_streams_as_text(client):
    body = chat(
        {"role": "user", "content": "Say hello to Anna."},
        tools=[EVENT_TOOL],
        temperature=0,
        max_tokens=16,
    )
    plain, events = await answers(client, body)
    message = plain["choices"][0]["message"]
    assert message["tool_calls"] is None, "the base model answers this one with text"
    assert all(list(delta) == ["content"] for delta in deltas(events))
    assert "".join(delta["content"] for delta in deltas(events)) == message["content"]
    finish = [event for event in events if event["choices"]][-1]["choices"][0]
    assert finish["finish_reason"] == plain["choices"][0]["finish_reason"]
