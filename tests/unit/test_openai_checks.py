"""The checks (translate.py) for the OpenAI features beyond the reference: `tool_choice`,
`response_format` and `logprobs` on chat, the legacy `POST /v1/completions`
(parse_completion_request / prepare_completion, text and token-id prompts) and the tokenizer
endpoints (parse_tokenize_request / prepare_tokenize, parse_detokenize_request).

One case per line: add a row to add a case.
"""

from __future__ import annotations

from typing import Any

import pytest

from edgeserve import errors
from edgeserve.api.openai_chat.translate import parse_chat_request, prepare_chat, tool_calls_wanted
from edgeserve.api.openai_completions.translate import (
    completion_engine_error,
    parse_completion_request,
    prepare_completion,
)
from edgeserve.api.reference.engine_errors import token_engine_error
from edgeserve.api.reference.limits import Limits
from edgeserve.api.tokenize.translate import (
    parse_detokenize_request,
    parse_tokenize_request,
    prepare_tokenize,
)
from edgeserve.engine.types import (
    GenerationRequest,
    GrammarSpec,
    SamplingParams,
    ScoreRequest,
    Tokenization,
    TokenPrompt,
)
from edgeserve.grammars import ANY_JSON_OBJECT, either, schema_grammar, tool_call_grammar

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
    req = parse_completion_request({"prompt": "Once"})
    assert (req.model, req.max_tokens, req.n, req.echo, req.stream) == (None, 16, 1, False, False)


@pytest.mark.parametrize("prompt", ["Once", ["a", "b"], [1, 2], [[1], [2, 3]], [], [[]]], ids=repr)
def test_completion_prompt_shapes(prompt: Any) -> None:
    assert parse_completion_request(completion(prompt=prompt)).prompt == prompt


def test_completion_schema_422() -> None:
    with pytest.raises(errors.ApiError) as caught:
        parse_completion_request({"model": "m", "prompt": [1, "a"]})
    assert caught.value.status == 422
    assert [item["loc"] for item in caught.value.detail] == [
        ["body", "prompt", "str"],
        ["body", "prompt", "list[str]", 0],
        ["body", "prompt", "list[int]", 1],
        ["body", "prompt", "list[list[int]]", 0],
        ["body", "prompt", "list[list[int]]", 1],
    ]
    with pytest.raises(errors.ApiError) as caught:
        parse_completion_request({"model": "m", "prompt": [[1.5]]})
    assert caught.value.status == 422
    assert ["body", "prompt", "list[list[int]]", 0, 0] in [i["loc"] for i in caught.value.detail]
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
        '"prompt" is an empty list; send a string, a list of strings, a list of token ids or a '
        "list of token-id lists.",
    ),
    (
        "an empty token-id list",
        completion(prompt=[[1], []], suffix="checked later"),
        '"prompt[1]" is an empty list of token ids; send at least one token id.',
    ),
    (
        "the only token-id list is empty",
        completion(prompt=[[]]),
        '"prompt[0]" is an empty list of token ids; send at least one token id.',
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
        '"prompt" has 3 prompts and "n" is 2: 6 choices, but this server allows at most 4 per '
        "request; send fewer prompts or lower n.",
    ),
    (
        "token-id lists × n over the cap",
        completion(prompt=[[1], [2], [3]], n=2),
        '"prompt" has 3 prompts and "n" is 2: 6 choices, but this server allows at most 4 per '
        "request; send fewer prompts or lower n.",
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
    work = prepare_completion(parse_completion_request(body), limits)
    assert work.requests == tuple(GenerationRequest(prompt=p, params=params, n=n) for p in prompts)


PROMPTS = [
    ("a text", "Once", ("Once",), ("prompt",)),
    ("texts", ["a", "b"], ("a", "b"), ("prompt[0]", "prompt[1]")),
    ("token ids", [2, 5, 9], (TokenPrompt((2, 5, 9)),), ("prompt",)),
    (
        "token-id lists",
        [[2, 5], [7]],
        (TokenPrompt((2, 5)), TokenPrompt((7,))),
        ("prompt[0]", "prompt[1]"),
    ),
]


@pytest.mark.parametrize(
    ("prompt", "prompts", "names"), [c[1:] for c in PROMPTS], ids=[c[0] for c in PROMPTS]
)
def test_completion_prompts(
    prompt: Any, prompts: tuple[Any, ...], names: tuple[str, ...], limits: Limits
) -> None:
    """Each prompt becomes one engine request; token ids go to the engine as given (its
    vocabulary check is the engine's, named by completion_engine_error)."""
    work = prepare_completion(parse_completion_request(completion(prompt=prompt)), limits)
    assert (work.prompts, work.names) == (prompts, names)
    assert tuple(g.prompt for g in work.requests) == prompts
    assert work.scoring is None


ECHO_SCORING = [
    ("echo alone scores nothing", {"echo": True}, 1, None),
    ("logprobs alone scores nothing", {"logprobs": 2}, 1, None),
    ("echo with logprobs", {"echo": True, "logprobs": 2}, 1, 2),
    ("echo with logprobs 0", {"echo": True, "logprobs": 0}, 1, 0),
    ("echo, max_tokens 0: scoring only", {"echo": True, "max_tokens": 0}, 0, 0),
]


@pytest.mark.parametrize(
    ("fields", "generations", "top"),
    [c[1:] for c in ECHO_SCORING],
    ids=[c[0] for c in ECHO_SCORING],
)
def test_completion_echo_scoring(
    fields: dict[str, Any], generations: int, top: int | None, limits: Limits
) -> None:
    prompt = [[2, 5], [7]]
    body = completion(prompt=prompt, **fields)
    work = prepare_completion(parse_completion_request(body), limits)
    assert len(work.requests) == 2 * generations
    expected = ScoreRequest(texts=work.prompts, top_logprobs=top) if top is not None else None
    assert work.scoring == expected


UNKNOWN_IN_LIST = (
    '"prompt[1][4]" is the token id 262144, which is not in the vocabulary of this model (ids 0 '
    "to 262143); send ids from its tokenizer (POST /tokenize)."
)
ENGINE_ERRORS = [
    (
        "too long, one text",
        errors.PromptTooLong(3000, 2048),
        ("prompt",),
        0,
        '"prompt" is 3000 tokens but the context window is 2048 tokens; shorten it (it must '
        "leave room for at least one new token).",
    ),
    (
        "too long, a list",
        errors.PromptTooLong(3000, 2048),
        ("prompt[0]", "prompt[1]"),
        1,
        '"prompt[1]" is 3000 tokens but the context window is 2048 tokens; shorten it (it '
        "must leave room for at least one new token).",
    ),
    (
        "too long, echo scoring names the text",
        errors.PromptTooLong(3000, 2048, index=1),
        ("prompt[0]", "prompt[1]"),
        None,
        '"prompt[1]" is 3000 tokens but the context window is 2048 tokens; shorten it (it '
        "must leave room for at least one new token).",
    ),
    (
        "unknown token, one list",
        errors.UnknownToken(0, -1, 262144),
        ("prompt",),
        0,
        '"prompt[0]" is the token id -1, which is not in the vocabulary of this model (ids 0 to '
        "262143); send ids from its tokenizer (POST /tokenize).",
    ),
    (
        "unknown token, a list of lists",
        errors.UnknownToken(4, 262144, 262144),
        ("prompt[0]", "prompt[1]"),
        1,
        UNKNOWN_IN_LIST,
    ),
    (
        "unknown token, echo scoring names the list",
        errors.UnknownToken(4, 262144, 262144, index=1),
        ("prompt[0]", "prompt[1]"),
        None,
        UNKNOWN_IN_LIST,
    ),
    (
        "busy",
        errors.EngineOverloaded(),
        ("prompt",),
        0,
        "Server is busy: the request queue is full; retry later.",
    ),
]


@pytest.mark.parametrize(
    ("exc", "names", "index", "detail"),
    [c[1:] for c in ENGINE_ERRORS],
    ids=[c[0] for c in ENGINE_ERRORS],
)
def test_completion_engine_error(
    exc: errors.EngineError, names: tuple[str, ...], index: int | None, detail: str
) -> None:
    err = completion_engine_error(exc, names, index)
    assert (err.status, err.detail) == (503 if "busy" in detail else 400, detail)


def test_token_engine_error() -> None:
    err = token_engine_error(errors.UnknownToken(2, 300000, 262144), "tokens")
    assert (err.status, err.detail) == (
        400,
        '"tokens[2]" is the token id 300000, which is not in the vocabulary of this model (ids '
        "0 to 262143); send ids from its tokenizer (POST /tokenize).",
    )
    assert token_engine_error(errors.EngineOverloaded(), "tokens").status == 503


# --- POST /tokenize, POST /detokenize ----------------------------------------------------------

TOKENIZE = [
    ("vLLM's shape adds special tokens", {"prompt": "hi"}, Tokenization("hi", True, True)),
    (
        "vLLM's shape without them (lm-eval)",
        {"prompt": "hi", "add_special_tokens": False},
        Tokenization("hi", False, True),
    ),
    ("llama-server's shape does not", {"content": "hi"}, Tokenization("hi", False, True)),
    (
        "llama-server's options",
        {"content": "hi", "add_special": True, "parse_special": False},
        Tokenization("hi", True, False),
    ),
    (
        "vLLM's name wins",
        {"prompt": "hi", "add_special_tokens": False, "add_special": True},
        Tokenization("hi", False, True),
    ),
    ("an empty text", {"prompt": "", "model": "m"}, Tokenization("", True, True)),
]


@pytest.mark.parametrize(("body", "work"), [c[1:] for c in TOKENIZE], ids=[c[0] for c in TOKENIZE])
def test_tokenize_work(body: dict[str, Any], work: Tokenization) -> None:
    assert prepare_tokenize(parse_tokenize_request(body)) == work


TOKENIZE_ERRORS = [
    (
        "no text",
        {"messages": [USER]},
        'The request has no text to tokenize; send {"prompt": "..."} (or llama-server\'s '
        '{"content": "..."}).',
    ),
    (
        "two texts",
        {"prompt": "a", "content": "b"},
        'The request has both "prompt" and "content"; send the text in one of them.',
    ),
    (
        "lone surrogate",
        {"content": "\ud800"},
        "content contains an unpaired UTF-16 surrogate; send valid Unicode text.",
    ),
]


@pytest.mark.parametrize(
    ("body", "detail"), [c[1:] for c in TOKENIZE_ERRORS], ids=[c[0] for c in TOKENIZE_ERRORS]
)
def test_tokenize_errors(body: dict[str, Any], detail: str) -> None:
    with pytest.raises(errors.ApiError) as caught:
        prepare_tokenize(parse_tokenize_request(body))
    assert (caught.value.status, caught.value.detail) == (400, detail)


SCHEMA_422 = [
    ("tokenize: prompt not a string", parse_tokenize_request, {"prompt": [1]}, ["prompt"]),
    ("tokenize: a list body", parse_tokenize_request, ["hi"], []),
    ("detokenize: no tokens", parse_detokenize_request, {"prompt": "x"}, ["tokens"]),
    ("detokenize: not ints", parse_detokenize_request, {"tokens": [1, "a"]}, ["tokens", 1]),
    ("detokenize: floats", parse_detokenize_request, {"tokens": [1.5]}, ["tokens", 0]),
]


@pytest.mark.parametrize(
    ("parse", "body", "loc"), [c[1:] for c in SCHEMA_422], ids=[c[0] for c in SCHEMA_422]
)
def test_tokenizer_schema_422(parse: Any, body: Any, loc: list[Any]) -> None:
    with pytest.raises(errors.ApiError) as caught:
        parse(body)
    assert caught.value.status == 422
    assert [item["loc"] for item in caught.value.detail] == [["body", *loc]]


def test_detokenize_schema() -> None:
    assert parse_detokenize_request({"tokens": []}).tokens == []
    assert parse_detokenize_request({"tokens": [2, 9], "model": "m"}).tokens == [2, 9]
