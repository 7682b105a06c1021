"""The wire models (api/*/wire.py) through the parse functions: the reference's 422 bodies byte for
byte (reference-api.md section 4), lax coercions (section 1.3) and the extension fields."""

from __future__ import annotations

import math
from typing import Any

import pytest

from edgeserve import errors
from edgeserve.api.common.wire import Role, StreamOptions
from edgeserve.api.openai_chat.translate import parse_chat_request
from edgeserve.api.openai_chat.wire import ChatCompletionRequest
from edgeserve.api.reference.errors import error_body
from edgeserve.api.reference.request import EMPTY_BODY, decode_json_body
from edgeserve.api.score.translate import parse_score_request
from edgeserve.api.score.wire import ScoreEvaluationRequest

HI = [{"role": "user", "content": "hi"}]


def chat(**fields: Any) -> dict[str, Any]:
    return {"model": "m", "messages": HI, **fields}


def content(value: Any) -> dict[str, Any]:
    return {"model": "m", "messages": [{"role": "user", "content": value}]}


def detail_json(parse: Any, body: Any) -> str:
    with pytest.raises(errors.ApiError) as caught:
        parse(body)
    assert caught.value.status == 422
    return error_body(caught.value.detail, with_message=False).decode()


STRING_TYPE_5 = (
    '{"type":"string_type","loc":["body","messages",0,"content","str"],'
    '"msg":"Input should be a valid string","input":5}'
)

CHAT_422 = [
    (
        "empty body",
        EMPTY_BODY,
        '{"detail":[{"type":"missing","loc":["body"],"msg":"Field required","input":null}]}',
    ),
    (
        "JSON array",
        [],
        '{"detail":[{"type":"model_attributes_type","loc":["body"],"msg":"Input should be a valid '
        'dictionary or object to extract fields from","input":[]}]}',
    ),
    (
        "JSON null",
        None,
        '{"detail":[{"type":"model_attributes_type","loc":["body"],"msg":"Input should be a valid '
        'dictionary or object to extract fields from","input":null}]}',
    ),
    (
        "raw text body",
        decode_json_body(b"hello", "text/plain"),
        '{"detail":[{"type":"model_attributes_type","loc":["body"],"msg":"Input should be a valid '
        'dictionary or object to extract fields from","input":"hello"}]}',
    ),
    (
        "missing model",
        {"messages": HI},
        '{"detail":[{"type":"missing","loc":["body","model"],"msg":"Field required",'
        '"input":{"messages":[{"role":"user","content":"hi"}]}}]}',
    ),
    (
        "empty object",
        {},
        '{"detail":[{"type":"missing","loc":["body","model"],"msg":"Field required","input":{}},'
        '{"type":"missing","loc":["body","messages"],"msg":"Field required","input":{}}]}',
    ),
    (
        "messages not a list",
        {"model": "m", "messages": "hi"},
        '{"detail":[{"type":"list_type","loc":["body","messages"],"msg":"Input should be a valid '
        'list","input":"hi"}]}',
    ),
    (
        "role developer",
        {"model": "m", "messages": [{"role": "developer", "content": "hi"}]},
        '{"detail":[{"type":"enum","loc":["body","messages",0,"role"],"msg":"Input should be '
        "'user', 'assistant', 'system', 'function' or 'tool'\",\"input\":\"developer\","
        "\"ctx\":{\"expected\":\"'user', 'assistant', 'system', 'function' or 'tool'\"}}]}",
    ),
    (
        "content item input_audio",
        content([{"type": "input_audio", "input_audio": {}}]),
        '{"detail":[{"type":"string_type","loc":["body","messages",0,"content","str"],'
        '"msg":"Input should be a valid string","input":[{"type":"input_audio","input_audio":{}}]},'
        '{"type":"literal_error","loc":["body","messages",0,"content","list[MultimodalInputItem]",'
        "0,\"type\"],\"msg\":\"Input should be 'text', 'image_url', 'video_url' or 'audio_url'\","
        '"input":"input_audio","ctx":{"expected":"\'text\', \'image_url\', \'video_url\' or '
        "'audio_url'\"}}]}",
    ),
    (
        "content 5",
        content(5),
        '{"detail":[' + STRING_TYPE_5 + ',{"type":"list_type","loc":["body","messages",0,'
        '"content","list[MultimodalInputItem]"],"msg":"Input should be a valid list","input":5}]}',
    ),
    (
        "n two",
        chat(n="two"),
        '{"detail":[{"type":"int_parsing","loc":["body","n"],"msg":"Input should be a valid '
        'integer, unable to parse string as an integer","input":"two"}]}',
    ),
    (
        "n 1.5",
        chat(n=1.5),
        '{"detail":[{"type":"int_from_float","loc":["body","n"],"msg":"Input should be a valid '
        'integer, got a number with a fractional part","input":1.5}]}',
    ),
    (
        "n null",
        chat(n=None),
        '{"detail":[{"type":"int_type","loc":["body","n"],"msg":"Input should be a valid integer",'
        '"input":null}]}',
    ),
    (
        "stream maybe",
        chat(stream="maybe"),
        '{"detail":[{"type":"bool_parsing","loc":["body","stream"],"msg":"Input should be a valid '
        'boolean, unable to interpret input","input":"maybe"}]}',
    ),
    (
        "stream null",
        chat(stream=None),
        '{"detail":[{"type":"bool_type","loc":["body","stream"],"msg":"Input should be a valid '
        'boolean","input":null}]}',
    ),
    (
        "temperature hot",
        chat(temperature="hot"),
        '{"detail":[{"type":"float_parsing","loc":["body","temperature"],"msg":"Input should be a '
        'valid number, unable to parse string as a number","input":"hot"}]}',
    ),
    (
        "stop 5",
        chat(stop=5),
        '{"detail":[{"type":"string_type","loc":["body","stop","str"],"msg":"Input should be a '
        'valid string","input":5},{"type":"list_type","loc":["body","stop","list[str]"],'
        '"msg":"Input should be a valid list","input":5}]}',
    ),
    (
        "model 5",
        {"model": 5, "messages": HI},
        '{"detail":[{"type":"string_type","loc":["body","model"],"msg":"Input should be a valid '
        'string","input":5}]}',
    ),
    (
        "tool without parameters",
        chat(tools=[{"type": "function", "function": {"name": "f", "description": "d"}}]),
        '{"detail":[{"type":"missing","loc":["body","tools",0,"function","parameters"],'
        '"msg":"Field required","input":{"name":"f","description":"d"}}]}',
    ),
    (
        "tool web_search",
        chat(tools=[{"type": "web_search"}]),
        '{"detail":[{"type":"literal_error","loc":["body","tools",0,"type"],"msg":"Input should '
        'be \'function\' or \'code_interpreter\'","input":"web_search","ctx":{"expected":'
        "\"'function' or 'code_interpreter'\"}}]}",
    ),
    (
        "tool_call arguments object",
        {
            "model": "m",
            "messages": [
                {"role": "user", "content": "hi"},
                {
                    "role": "assistant",
                    "tool_calls": [{"id": "c", "function": {"name": "f", "arguments": {"a": 1}}}],
                },
            ],
        },
        '{"detail":[{"type":"string_type","loc":["body","messages",1,"tool_calls",0,"function",'
        '"arguments"],"msg":"Input should be a valid string","input":{"a":1}}]}',
    ),
    (
        "tool_call without id",
        {
            "model": "m",
            "messages": [
                {"role": "user", "content": "hi"},
                {
                    "role": "assistant",
                    "tool_calls": [
                        {"type": "function", "function": {"name": "f", "arguments": "{}"}}
                    ],
                },
            ],
        },
        '{"detail":[{"type":"missing","loc":["body","messages",1,"tool_calls",0,"id"],'
        '"msg":"Field required","input":{"type":"function","function":{"name":"f",'
        '"arguments":"{}"}}}]}',
    ),
    (
        "image detail ultra",
        content([{"type": "image_url", "image_url": {"url": "http://x/y.png", "detail": "ultra"}}]),
        '{"detail":[{"type":"string_type","loc":["body","messages",0,"content","str"],'
        '"msg":"Input should be a valid string","input":[{"type":"image_url","image_url":'
        '{"url":"http://x/y.png","detail":"ultra"}}]},{"type":"literal_error","loc":["body",'
        '"messages",0,"content","list[MultimodalInputItem]",0,"image_url","detail"],"msg":'
        '"Input should be \'auto\', \'low\' or \'high\'","input":"ultra","ctx":{"expected":'
        "\"'auto', 'low' or 'high'\"}}]}",
    ),
    (
        "non-ASCII input stays raw",
        {"model": "m", "messages": [{"role": "rôle"}]},
        '{"detail":[{"type":"enum","loc":["body","messages",0,"role"],"msg":"Input should be '
        "'user', 'assistant', 'system', 'function' or 'tool'\",\"input\":\"rôle\","
        "\"ctx\":{\"expected\":\"'user', 'assistant', 'system', 'function' or 'tool'\"}}]}",
    ),
    (
        "reference errors come before extension errors",
        {"messages": HI, "seed": "x", "n": "y"},
        '{"detail":[{"type":"missing","loc":["body","model"],"msg":"Field required","input":'
        '{"messages":[{"role":"user","content":"hi"}],"seed":"x","n":"y"}},{"type":"int_parsing",'
        '"loc":["body","n"],"msg":"Input should be a valid integer, unable to parse string as an '
        'integer","input":"y"},{"type":"int_parsing","loc":["body","seed"],"msg":"Input should be '
        'a valid integer, unable to parse string as an integer","input":"x"}]}',
    ),
    (
        "NaN input is echoed as null",
        chat(n=math.nan),
        '{"detail":[{"type":"finite_number","loc":["body","n"],"msg":"Input should be a finite '
        'number","input":null}]}',
    ),
    (
        "stream_options must be an object",
        chat(stream_options=True),
        '{"detail":[{"type":"model_attributes_type","loc":["body","stream_options"],"msg":"Input '
        'should be a valid dictionary or object to extract fields from","input":true}]}',
    ),
]


@pytest.mark.parametrize(
    ("body", "expected"),
    [case[1:] for case in CHAT_422],
    ids=[case[0] for case in CHAT_422],
)
def test_chat_422_bodies(body: Any, expected: str) -> None:
    assert detail_json(parse_chat_request, body) == expected


SCORE_422 = [
    (
        "message object",
        {"model": "rm", "messages": [{"role": "user"}]},
        '{"detail":[{"type":"string_type","loc":["body","messages",0],"msg":"Input should be a '
        'valid string","input":{"role":"user"}}]}',
    ),
    (
        "max_length x",
        {"model": "rm", "messages": ["a"], "max_length": "x"},
        '{"detail":[{"type":"int_parsing","loc":["body","max_length"],"msg":"Input should be a '
        'valid integer, unable to parse string as an integer","input":"x"}]}',
    ),
    (
        "missing messages",
        {"model": "m"},
        '{"detail":[{"type":"missing","loc":["body","messages"],"msg":"Field required",'
        '"input":{"model":"m"}}]}',
    ),
    (
        "empty body",
        EMPTY_BODY,
        '{"detail":[{"type":"missing","loc":["body"],"msg":"Field required","input":null}]}',
    ),
    (
        "reduction",
        {"model": "rm", "messages": ["a"], "reduction": "max"},
        '{"detail":[{"type":"literal_error","loc":["body","reduction"],"msg":"Input should be '
        '\'mean\' or \'sum\'","input":"max","ctx":{"expected":"\'mean\' or \'sum\'"}}]}',
    ),
]


@pytest.mark.parametrize(
    ("body", "expected"),
    [case[1:] for case in SCORE_422],
    ids=[case[0] for case in SCORE_422],
)
def test_score_422_bodies(body: Any, expected: str) -> None:
    assert detail_json(parse_score_request, body) == expected


LAX = [
    ("n from string", {"n": "2"}, "n", 2),
    ("n from whole float", {"n": 2.0}, "n", 2),
    ("stream 'true'", {"stream": "true"}, "stream", True),
    ("stream 'yes'", {"stream": "yes"}, "stream", True),
    ("stream '1'", {"stream": "1"}, "stream", True),
    ("stream 1", {"stream": 1}, "stream", True),
    ("stream 'off'", {"stream": "off"}, "stream", False),
    ("temperature from string", {"temperature": "0.5"}, "temperature", 0.5),
    ("temperature from int", {"temperature": 1}, "temperature", 1.0),
    ("max_tokens from string", {"max_tokens": "16"}, "max_tokens", 16),
    ("do_sample 'false'", {"do_sample": "false"}, "do_sample", False),
    ("stop string", {"stop": "x"}, "stop", "x"),
    ("stop list", {"stop": ["x", "y"]}, "stop", ["x", "y"]),
    ("n 0 passes the schema", {"n": 0}, "n", 0),
    ("max_tokens -1 passes the schema", {"max_tokens": -1}, "max_tokens", -1),
]


@pytest.mark.parametrize(
    ("fields", "name", "value"),
    [case[1:] for case in LAX],
    ids=[case[0] for case in LAX],
)
def test_lax_coercions(fields: dict[str, Any], name: str, value: Any) -> None:
    assert getattr(parse_chat_request(chat(**fields)), name) == value


def test_reference_defaults() -> None:
    req = parse_chat_request(chat())
    assert req.model_dump(include=set(list(ChatCompletionRequest.model_fields)[:11])) == {
        "model": "m",
        "messages": [{"role": Role.USER, "content": "hi", "tool_calls": None}],
        "tools": None,
        "do_sample": None,
        "temperature": None,
        "top_p": None,
        "n": 1,
        "presence_penalty": None,
        "max_tokens": None,
        "stop": None,
        "stream": False,
    }


def test_extension_fields_follow_the_reference_fields() -> None:
    assert list(ChatCompletionRequest.model_fields) == [
        "model",
        "messages",
        "tools",
        "do_sample",
        "temperature",
        "top_p",
        "n",
        "presence_penalty",
        "max_tokens",
        "stop",
        "stream",
        "seed",
        "top_k",
        "min_p",
        "frequency_penalty",
        "repetition_penalty",
        "logit_bias",
        "max_completion_tokens",
        "stream_options",
        "logprobs",
        "top_logprobs",
        "response_format",
        "tool_choice",
        "user",
    ]
    assert list(ScoreEvaluationRequest.model_fields) == [
        "model",
        "messages",
        "max_length",
        "reduction",
        "return_token_logprobs",
    ]


def test_extension_fields_parse() -> None:
    req = parse_chat_request(
        chat(
            seed=7,
            top_k=40,
            min_p=0.1,
            frequency_penalty=0.2,
            repetition_penalty=1.1,
            logit_bias={"42": -100},
            max_completion_tokens=9,
            stream_options={"include_usage": True},
            logprobs=True,
            top_logprobs=3,
            response_format={"type": "json_object"},
            tool_choice={"type": "function", "function": {"name": "f"}},
            user="u-1",
        )
    )
    assert req.stream_options == StreamOptions(include_usage=True)
    assert req.response_format is not None and req.response_format.type == "json_object"
    assert req.tool_choice == {"type": "function", "function": {"name": "f"}}
    assert (req.seed, req.top_k, req.logit_bias, req.user) == (7, 40, {"42": -100.0}, "u-1")


def test_tool_description_is_optional() -> None:
    # The reference answers 422; OpenAI (and edgeserve) default it to empty.
    req = parse_chat_request(chat(tools=[{"function": {"name": "f", "parameters": {}}}]))
    assert req.tools is not None and req.tools[0].function is not None
    assert req.tools[0].function.description == ""


def test_stream_options_default() -> None:
    assert parse_chat_request(chat(stream_options={})).stream_options == StreamOptions()


UNKNOWN_FIELDS = [
    ("top level", chat(service_tier="auto", parallel_tool_calls=False)),
    ("message name", {"model": "m", "messages": [{"role": "user", "content": "hi", "name": "x"}]}),
    (
        "tool message id",
        {"model": "m", "messages": [{"role": "tool", "content": "1", "tool_call_id": "c"}]},
    ),
    ("content item", content([{"type": "text", "text": "hi", "cache_control": {}}])),
]


@pytest.mark.parametrize(
    "body", [case[1] for case in UNKNOWN_FIELDS], ids=[case[0] for case in UNKNOWN_FIELDS]
)
def test_unknown_fields_are_ignored(body: dict[str, Any]) -> None:
    parse_chat_request(body)


def test_score_defaults() -> None:
    req = parse_score_request({"model": "rm", "messages": ["a", "b"], "extra": 1})
    assert req.model_dump() == {
        "model": "rm",
        "messages": ["a", "b"],
        "max_length": None,
        "reduction": "mean",
        "return_token_logprobs": False,
    }
