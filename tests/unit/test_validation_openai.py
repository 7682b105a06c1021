"""edgeserve.validation for the OpenAI features beyond the reference: `tool_choice`,
`response_format` and `logprobs` on chat, and the legacy `POST /v1/completions`
(parse_completion_request / prepare_completion).

One case per line: add a row to add a case.
"""

from __future__ import annotations

from typing import Any

import pytest

from edgeserve import errors
from edgeserve.engine.types import GenerationRequest, GrammarSpec, SamplingParams
from edgeserve.grammars import ANY_JSON_OBJECT, either, schema_grammar, tool_call_grammar
from edgeserve.validation import (
    Limits,
    completion_engine_error,
    parse_chat_request,
    parse_completion_request,
    prepare_chat,
    prepare_completion,
    tool_calls_wanted,
)

USER = {"role": "user", "content": "hi"}
TOOL = {
    "type": "function",
    "function": {"name": "now", "description": "the time", "parameters": {"type": "object"}},
}
WEATHER = {
    "type": "function",
    "function": {
        "name": "weather",
        "description": "the weather",
        "parameters": {
            "type": "object",
            "properties": {"city": {"enum": ["Paris", "Oslo"]}},
            "required": ["city"],
        },
    },
}
WITHOUT_TOOLS = (
    '"tool_choice": {} forces a tool call but the request has no "tools"; add the functions '
    "or leave tool_choice out."
)
UNKNOWN = (
    '"tool_choice" names the function "later", which is not in "tools" ("now"); name one of those.'
)
INVALID = (
    '"tool_choice" must be "none", "auto", "required" or '
    '{{"type": "function", "function": {{"name": "..."}}}}, got {}.'
)


def chat(**fields: Any) -> dict[str, Any]:
    return {"model": "m", "messages": [USER], **fields}


def completion(**fields: Any) -> dict[str, Any]:
    return {"model": "m", "prompt": "Once", **fields}


@pytest.fixture
def limits(tmp_path) -> Limits:
    return Limits(max_n=4, max_tokens=100, safe_media_path=str(tmp_path))


# --- tool_choice ------------------------------------------------------------------------------

TOOL_CHOICE = [
    ("absent", {}, None),
    ("none", {"tool_choice": "none"}, None),
    ("auto", {"tool_choice": "auto"}, None),
    ("auto without tools (the reference ignores it)", {"tool_choice": "auto", "tools": None}, None),
    ("required", {"tool_choice": "required"}, None),
    ("named", {"tool_choice": {"type": "function", "function": {"name": "now"}}}, None),
    (
        "named, not in tools",
        {"tool_choice": {"type": "function", "function": {"name": "later"}}},
        UNKNOWN,
    ),
    (
        "required without tools",
        {"tool_choice": "required", "tools": None},
        WITHOUT_TOOLS.format('"required"'),
    ),
    (
        "named, empty tools",
        {"tool_choice": {"type": "function", "function": {"name": "now"}}, "tools": []},
        WITHOUT_TOOLS.format('{"type": "function", "function": {"name": "now"}}'),
    ),
    ("unknown word", {"tool_choice": "always"}, INVALID.format('"always"')),
    ("a number", {"tool_choice": 1}, INVALID.format("1")),
    (
        "a function without a name",
        {"tool_choice": {"type": "function", "function": {}}},
        INVALID.format('{"type": "function", "function": {}}'),
    ),
]


@pytest.mark.parametrize(
    ("fields", "detail"), [c[1:] for c in TOOL_CHOICE], ids=[c[0] for c in TOOL_CHOICE]
)
async def test_tool_choice(fields: dict[str, Any], detail: str | None, limits: Limits) -> None:
    body = chat(**{"tools": [TOOL], **fields})
    req = parse_chat_request(body)
    if detail is None:
        await prepare_chat(req, limits)
        return
    with pytest.raises(errors.ApiError) as caught:
        await prepare_chat(req, limits)
    assert (caught.value.status, caught.value.detail) == (400, detail)


async def test_reference_errors_come_before_tool_choice(limits: Limits) -> None:
    req = parse_chat_request(chat(tools=[TOOL], tool_choice="required", stream=True, n=2))
    with pytest.raises(errors.ApiError) as caught:
        await prepare_chat(req, limits)
    assert caught.value.detail == "Cannot stream multiple responses."


WANTED = [
    ("tools, no tool_choice", {"tools": [TOOL]}, True),
    ("tools, auto", {"tools": [TOOL], "tool_choice": "auto"}, True),
    ("tools, none", {"tools": [TOOL], "tool_choice": "none"}, False),
    ("no tools", {}, False),
    ("empty tools", {"tools": []}, False),
]


@pytest.mark.parametrize(("fields", "wanted"), [c[1:] for c in WANTED], ids=[c[0] for c in WANTED])
def test_tool_calls_wanted(fields: dict[str, Any], wanted: bool) -> None:
    assert tool_calls_wanted(parse_chat_request(chat(**fields))) is wanted


async def test_tool_choice_none_still_shows_the_tools(limits: Limits) -> None:
    work = await prepare_chat(parse_chat_request(chat(tools=[TOOL], tool_choice="none")), limits)
    assert work.prompt.tools is not None and '"now"' in work.prompt.tools


# --- the output grammar: response_format and forced tool calls -------------------------------

SCHEMA = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}
AS_SCHEMA = {"type": "json_schema", "json_schema": {"name": "x", "schema": SCHEMA, "strict": True}}
NOW = ("now", TOOL["function"]["parameters"])
WEATHER_CALL = ("weather", WEATHER["function"]["parameters"])
NAMED = {"type": "function", "function": {"name": "weather"}}

GRAMMARS = [
    ("no format", {}, None),
    ("text", {"response_format": {"type": "text"}}, None),
    ("json_object", {"response_format": {"type": "json_object"}}, GrammarSpec("json_object")),
    ("json_schema", {"response_format": AS_SCHEMA}, GrammarSpec("gbnf", schema_grammar(SCHEMA))),
    ("tools the model may call", {"tools": [WEATHER]}, None),
    (
        "required: a call of any tool",
        {"tools": [TOOL, WEATHER], "tool_choice": "required"},
        GrammarSpec("gbnf", tool_call_grammar([NOW, WEATHER_CALL])),
    ),
    (
        "named: a call of that tool",
        {"tools": [TOOL, WEATHER], "tool_choice": NAMED},
        GrammarSpec("gbnf", tool_call_grammar([WEATHER_CALL])),
    ),
    (
        "a forced call wins over response_format",
        {"tools": [WEATHER], "tool_choice": "required", "response_format": AS_SCHEMA},
        GrammarSpec("gbnf", tool_call_grammar([WEATHER_CALL])),
    ),
    (
        "tools and a schema: a call or the schema",
        {"tools": [WEATHER], "response_format": AS_SCHEMA},
        GrammarSpec("gbnf", either([tool_call_grammar([WEATHER_CALL]), schema_grammar(SCHEMA)])),
    ),
    (
        "tools and json_object: a call or any object",
        {"tools": [WEATHER], "tool_choice": "auto", "response_format": {"type": "json_object"}},
        GrammarSpec("gbnf", either([tool_call_grammar([WEATHER_CALL]), ANY_JSON_OBJECT])),
    ),
    (
        'tool_choice "none": the format only',
        {"tools": [WEATHER], "tool_choice": "none", "response_format": {"type": "json_object"}},
        GrammarSpec("json_object"),
    ),
]


@pytest.mark.parametrize(
    ("fields", "grammar"), [c[1:] for c in GRAMMARS], ids=[c[0] for c in GRAMMARS]
)
async def test_grammar(fields: dict[str, Any], grammar: GrammarSpec | None, limits: Limits) -> None:
    work = await prepare_chat(parse_chat_request(chat(**fields)), limits)
    assert work.params.grammar == grammar


def schema_format(schema: Any) -> dict[str, Any]:
    return {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}


NO_SCHEMA = (
    '"response_format.json_schema" has no "schema" object; put the JSON schema of the answer '
    'there, or use {"type": "json_object"} for any JSON object.'
)
UNUSABLE = (
    '"response_format.json_schema.schema" cannot be turned into a grammar: {}; simplify the '
    'schema, or use {{"type": "json_object"}}.'
)
TOP_WITHOUT = '"top_logprobs" requires "logprobs": true; set it or leave top_logprobs out.'

CHAT_ERRORS = [
    (
        "json_schema without a schema",
        {"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}},
        NO_SCHEMA,
    ),
    ("a schema that is not an object", {"response_format": schema_format(True)}, NO_SCHEMA),
    (
        "a schema the converter rejects",
        {"response_format": schema_format({"type": "nonsense"})},
        UNUSABLE.format("Unrecognized schema: {'type': 'nonsense'}"),
    ),
    (
        "a schema over the repetition limit",
        {"response_format": schema_format({"type": "string", "maxLength": 5000})},
        UNUSABLE.format('"maxLength" repeats 5000 times; the limit is 1000'),
    ),
    (
        "a lone surrogate in a pattern's class",
        {"response_format": schema_format({"type": "string", "pattern": "^[a\ud800]$"})},
        "response_format contains an unpaired UTF-16 surrogate; send valid Unicode text.",
    ),
    (
        "a pattern that needs a lone surrogate",
        {"response_format": schema_format({"type": "string", "pattern": "^\ud800$"})},
        UNUSABLE.format(
            "it needs a character that no token can produce (U+0000, a UTF-16 surrogate or one "
            'past U+10FFFF) in "\ud800"'
        ),
    ),
    ("top_logprobs without logprobs", {"top_logprobs": 2}, TOP_WITHOUT),
    ("top_logprobs with logprobs false", {"logprobs": False, "top_logprobs": 0}, TOP_WITHOUT),
    (
        "top_logprobs out of range comes first",
        {"top_logprobs": 21},
        '"top_logprobs" must be between 0 and 20, got 21.',
    ),
]


@pytest.mark.parametrize(
    ("fields", "detail"), [c[1:] for c in CHAT_ERRORS], ids=[c[0] for c in CHAT_ERRORS]
)
async def test_chat_errors(fields: dict[str, Any], detail: str, limits: Limits) -> None:
    with pytest.raises(errors.ApiError) as caught:
        await prepare_chat(parse_chat_request(chat(**fields)), limits)
    assert (caught.value.status, caught.value.detail) == (400, detail)


LOGPROBS = [
    ("absent", {}, None),
    ("false", {"logprobs": False}, None),
    ("true: the sampled token only", {"logprobs": True}, 0),
    ("true with top_logprobs", {"logprobs": True, "top_logprobs": 20}, 20),
]


@pytest.mark.parametrize(
    ("fields", "logprobs"), [c[1:] for c in LOGPROBS], ids=[c[0] for c in LOGPROBS]
)
async def test_chat_logprobs(fields: dict[str, Any], logprobs: int | None, limits: Limits) -> None:
    work = await prepare_chat(parse_chat_request(chat(**fields)), limits)
    assert work.params.logprobs == logprobs


# --- POST /v1/completions: schema -------------------------------------------------------------


def test_completion_schema_defaults() -> None:
    req = parse_completion_request(completion())
    assert (req.max_tokens, req.n, req.echo, req.stream) == (16, 1, False, False)


def test_completion_schema_422() -> None:
    with pytest.raises(errors.ApiError) as caught:
        parse_completion_request({"model": "m", "prompt": [1, 2]})
    assert caught.value.status == 422
    assert [item["loc"] for item in caught.value.detail] == [
        ["body", "prompt", "str"],
        ["body", "prompt", "list[str]", 0],
        ["body", "prompt", "list[str]", 1],
    ]
    with pytest.raises(errors.ApiError) as caught:
        parse_completion_request({"model": "m"})
    assert caught.value.detail == [
        {
            "type": "missing",
            "loc": ["body", "prompt"],
            "msg": "Field required",
            "input": {"model": "m"},
        }
    ]


# --- POST /v1/completions: 400s, in check order ---------------------------------------------

COMPLETION_ERRORS = [
    (
        "empty prompt list",
        completion(prompt=[]),
        '"prompt" is an empty list; send a string or a list of strings.',
    ),
    (
        "suffix",
        completion(suffix="end"),
        '"suffix" is not supported (this server does no fill-in-the-middle); '
        "leave it out or send null.",
    ),
    (
        "best_of above n",
        completion(best_of=3),
        '"best_of" is not supported; leave it out or set it equal to "n" (1), got 3.',
    ),
    (
        "max_tokens 0 without echo",
        completion(max_tokens=0, logprobs=50),
        '"max_tokens" must be at least 1, got 0.',
    ),
    ("logprobs over 20", completion(logprobs=21), '"logprobs" must be between 0 and 20, got 21.'),
    ("negative logprobs", completion(logprobs=-1), '"logprobs" must be between 0 and 20, got -1.'),
    (
        "max_tokens over the cap",
        completion(max_tokens=101),
        '"max_tokens" is 101 but this server allows at most 100; lower it.',
    ),
    ("n 0", completion(n=0), '"n" must be at least 1, got 0.'),
    ("n over the cap", completion(n=5), '"n" is 5 but this server allows at most 4; lower it.'),
    (
        "texts × n over the cap",
        completion(prompt=["a", "b", "c"], n=2),
        '"prompt" has 3 texts and "n" is 2: 6 choices, but this server allows at most 4 per '
        "request; send fewer texts or lower n.",
    ),
    (
        "temperature",
        completion(temperature=-1),
        '"temperature" must be at least 0.0, got -1.0.',
    ),
    (
        "top_p",
        completion(top_p=2),
        '"top_p" must be between 0.0 and 1.0, got 2.0.',
    ),
    (
        "logit_bias key",
        completion(logit_bias={"x": 1}),
        '"logit_bias" keys must be token ids written as decimal integers of at most 9 digits, '
        'got "x".',
    ),
    (
        "lone surrogate in a list prompt",
        completion(prompt=["ok", "\ud800"]),
        "prompt[1] contains an unpaired UTF-16 surrogate; send valid Unicode text.",
    ),
    (
        "lone surrogate in the prompt",
        completion(prompt="\ud800"),
        "prompt contains an unpaired UTF-16 surrogate; send valid Unicode text.",
    ),
]


@pytest.mark.parametrize(
    ("body", "detail"),
    [c[1:] for c in COMPLETION_ERRORS],
    ids=[c[0] for c in COMPLETION_ERRORS],
)
def test_completion_errors(body: dict[str, Any], detail: str, limits: Limits) -> None:
    with pytest.raises(errors.ApiError) as caught:
        prepare_completion(parse_completion_request(body), limits)
    assert (caught.value.status, caught.value.detail) == (400, detail)


# --- POST /v1/completions: engine requests ---------------------------------------------------

COMPLETION_WORK = [
    (
        "one text, OpenAI's default 16 tokens",
        completion(),
        ["Once"],
        1,
        SamplingParams(max_tokens=16),
    ),
    ("null max_tokens: as many as fit", completion(max_tokens=None), ["Once"], 1, SamplingParams()),
    (
        "a list, n=2 forces sampling",
        completion(prompt=["a", "b"], n=2, temperature=0, max_tokens=3),
        ["a", "b"],
        2,
        SamplingParams(max_tokens=3, temperature=1.0),
    ),
    (
        "sampling fields as chat",
        completion(
            temperature=0,
            top_p=0.5,
            seed=7,
            stop=["\n", ""],
            logit_bias={"1": -100},
            presence_penalty=0.5,
            frequency_penalty=0.25,
            top_k=40,
            min_p=0.1,
            repetition_penalty=1.1,
        ),
        ["Once"],
        1,
        SamplingParams(
            max_tokens=16,
            temperature=0.0,
            top_p=0.5,
            seed=7,
            stop=("\n",),
            logit_bias={1: -100.0},
            presence_penalty=0.5,
            frequency_penalty=0.25,
            top_k=40,
            min_p=0.1,
            repeat_penalty=1.1,
        ),
    ),
    ("best_of equal to n", completion(best_of=1), ["Once"], 1, SamplingParams(max_tokens=16)),
    (
        "empty suffix is no suffix",
        completion(suffix=""),
        ["Once"],
        1,
        SamplingParams(max_tokens=16),
    ),
    ("an empty prompt text", completion(prompt=""), [""], 1, SamplingParams(max_tokens=16)),
    ("logprobs 0", completion(logprobs=0), ["Once"], 1, SamplingParams(max_tokens=16, logprobs=0)),
    (
        "logprobs 20",
        completion(logprobs=20),
        ["Once"],
        1,
        SamplingParams(max_tokens=16, logprobs=20),
    ),
]


@pytest.mark.parametrize(
    ("body", "prompts", "n", "params"),
    [c[1:] for c in COMPLETION_WORK],
    ids=[c[0] for c in COMPLETION_WORK],
)
def test_completion_work(
    body: dict[str, Any], prompts: list[str], n: int, params: SamplingParams, limits: Limits
) -> None:
    works = prepare_completion(parse_completion_request(body), limits)
    assert works == [GenerationRequest(prompt=p, params=params, n=n) for p in prompts]


ENGINE_ERRORS = [
    (
        "too long, one text",
        errors.PromptTooLong(3000, 2048),
        0,
        1,
        True,
        '"prompt" is 3000 tokens but the context window is 2048 tokens; shorten it (it must '
        "leave room for at least one new token).",
    ),
    (
        "too long, a list",
        errors.PromptTooLong(3000, 2048),
        1,
        2,
        False,
        '"prompt[1]" is 3000 tokens but the context window is 2048 tokens; shorten it (it '
        "must leave room for at least one new token).",
    ),
    (
        "busy",
        errors.EngineOverloaded(),
        0,
        1,
        True,
        "Server is busy: the request queue is full; retry later.",
    ),
]


@pytest.mark.parametrize(
    ("exc", "index", "count", "single", "detail"),
    [c[1:] for c in ENGINE_ERRORS],
    ids=[c[0] for c in ENGINE_ERRORS],
)
def test_completion_engine_error(
    exc: errors.EngineError, index: int, count: int, single: bool, detail: str
) -> None:
    assert completion_engine_error(exc, index, count, single).detail == detail
