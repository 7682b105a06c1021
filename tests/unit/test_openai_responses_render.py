"""api/openai_responses/render.py: the Responses body and stream events, from answer pieces."""

from __future__ import annotations

import json
from typing import Any

from edgeserve.api.common.generating_api import ChoiceEnd, TokenUsage
from edgeserve.api.common.tool_calls import ToolCall
from edgeserve.api.common.tool_stream import CallArguments, CallStart, Content
from edgeserve.api.openai_responses.render import ResponsesRenderer, response_body, response_usage
from edgeserve.api.openai_responses.wire import ResponsesRequest
from edgeserve.engine.types import Finished

REQ = ResponsesRequest(model="m", input="hi", instructions="be brief", max_output_tokens=9)
USAGE = response_usage(5, 3, 2)
STREAM_USAGE = TokenUsage(prompt_tokens=5, generated={0: 3}, cached={0: 2})


def events(frames: list[bytes]) -> list[dict[str, Any]]:
    """Each SSE frame's data, checked against its `event:` line."""
    parsed = []
    for frame in frames:
        head, data = frame.decode().removesuffix("\n\n").split("\n")
        payload = json.loads(data.removeprefix("data: "))
        assert head == f"event: {payload['type']}"
        parsed.append(payload)
    return parsed


def test_usage() -> None:
    assert USAGE.model_dump() == {
        "input_tokens": 5,
        "input_tokens_details": {"cached_tokens": 2},
        "output_tokens": 3,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": 8,
    }


def test_text_body() -> None:
    body = json.loads(response_body(REQ, "Hello", None, "stop", USAGE))
    assert body["object"] == "response" and body["status"] == "completed"
    assert body["incomplete_details"] is None
    [message] = body["output"]
    assert message["type"] == "message" and message["status"] == "completed"
    assert message["content"] == [
        {"type": "output_text", "text": "Hello", "annotations": [], "logprobs": []}
    ]
    assert (body["instructions"], body["max_output_tokens"], body["store"]) == (
        "be brief",
        9,
        False,
    )
    assert body["text"] == {
        "format": {
            "type": "text",
            "name": None,
            "schema": None,
            "description": None,
            "strict": None,
        }
    }


def test_cut_body_is_incomplete() -> None:
    body = json.loads(response_body(REQ, "Hel", None, "length", USAGE))
    assert body["status"] == "incomplete" and body["output"][0]["status"] == "incomplete"
    assert body["incomplete_details"] == {"reason": "max_output_tokens"}


def test_call_body() -> None:
    calls = [ToolCall("a", '{"x": 1}'), ToolCall("b", "{}")]
    body = json.loads(response_body(REQ, "ignored", calls, "stop", USAGE))
    assert [(i["type"], i["name"], i["arguments"]) for i in body["output"]] == [
        ("function_call", "a", '{"x": 1}'),
        ("function_call", "b", "{}"),
    ]
    assert body["output"][0]["call_id"] != body["output"][1]["call_id"]


def test_text_stream() -> None:
    stream = ResponsesRenderer(REQ)
    frames = (
        stream.start()
        + stream.pieces(0, [Content("Hel")], None)
        + stream.pieces(0, [Content("lo")], None)
    )
    got = events(
        frames + stream.finish(ChoiceEnd(Finished(0, "stop", 3), False, None), STREAM_USAGE)
    )
    assert [e["type"] for e in got] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert [e["sequence_number"] for e in got] == list(range(len(got)))
    assert got[0]["response"]["status"] == "in_progress" and got[0]["response"]["output"] == []
    assert got[2]["item"]["content"] == [] and got[2]["item"]["status"] == "in_progress"
    item_id = got[2]["item"]["id"]
    assert {e["item_id"] for e in got[3:9] if "item_id" in e} == {item_id}
    assert [e["delta"] for e in got[4:6]] == ["Hel", "lo"]
    assert got[6]["text"] == "Hello" and got[7]["part"]["text"] == "Hello"
    assert got[8]["item"]["status"] == "completed"
    final = got[9]["response"]
    assert final["output"] == [got[8]["item"]] and final["usage"]["total_tokens"] == 8


def test_empty_cut_stream_has_an_empty_incomplete_message() -> None:
    stream = ResponsesRenderer(REQ)
    got = events(
        stream.start()
        + stream.finish(ChoiceEnd(Finished(0, "length", 3), False, None), STREAM_USAGE)
    )
    assert [e["type"] for e in got][2:] == [
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.incomplete",
    ]
    assert got[-2]["item"]["status"] == "incomplete" and got[-3]["part"]["text"] == ""
    assert got[-1]["response"]["incomplete_details"] == {"reason": "max_output_tokens"}


def test_text_then_calls_stream() -> None:
    stream = ResponsesRenderer(REQ)
    pieces = [
        Content("ok "),
        CallStart(0, "a"),
        CallArguments(0, '{"x": '),
        CallArguments(0, "1}"),
        CallStart(1, "b"),
        CallArguments(1, "{}"),
    ]
    got = events(
        stream.start()
        + stream.pieces(0, pieces, None)
        + stream.finish(ChoiceEnd(Finished(0, "stop", 3), False, None), STREAM_USAGE)
    )
    assert [e["type"] for e in got][2:] == [
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]
    first_call = got[8]["item"]
    assert (first_call["name"], first_call["arguments"], first_call["status"]) == (
        "a",
        "",
        "in_progress",
    )
    assert got[11] == {
        "type": "response.function_call_arguments.done",
        "sequence_number": 11,
        "item_id": first_call["id"],
        "output_index": 1,
        "name": "a",
        "arguments": '{"x": 1}',
    }
    output = got[-1]["response"]["output"]
    assert [(i["type"], i["status"]) for i in output] == [
        ("message", "completed"),
        ("function_call", "completed"),
        ("function_call", "completed"),
    ]
    assert output[2]["arguments"] == "{}"
