"""edgeserve.grammars: JSON-schema grammars, forced tool-call grammars, unions and the limits
that keep a schema from expanding into a huge grammar. (tests/integration/test_openai_output.py
compiles these grammars in llama.cpp and samples from them.)"""

from __future__ import annotations

import json
from typing import Any

import pytest
from llama_cpp.llama_grammar import json_schema_to_gbnf

from edgeserve.grammars import (
    ANY_JSON_OBJECT,
    JSON_STRING_CHAR,
    MAX_REPEAT,
    MAX_SCHEMA_CHARS,
    PATTERN_DOT,
    GrammarError,
    either,
    schema_grammar,
    tool_call_grammar,
)

COLOR = {"type": "object", "properties": {"color": {"enum": ["red", "blue"]}}}


def test_a_schema_is_converted_by_llama_cpp_python() -> None:
    assert schema_grammar(COLOR) == json_schema_to_gbnf(json.dumps(COLOR))


def test_json_strings_take_no_raw_control_characters() -> None:
    """The converter's own string character allows U+0000-U+001F, which JSON forbids raw."""
    lax = json_schema_to_gbnf(json.dumps({"type": "string"}))
    strict = schema_grammar({"type": "string"})
    assert 'char ::= [^"\\\\] |' in lax
    assert f"char ::= {JSON_STRING_CHAR}" in strict
    assert f"char ::= {JSON_STRING_CHAR}" in ANY_JSON_OBJECT
    patterned = schema_grammar({"type": "string", "pattern": "^a.b$"})
    assert f"dot ::= {PATTERN_DOT}" in patterned


def test_bounds_up_to_the_limit_pass() -> None:
    schema = {"type": "string", "maxLength": MAX_REPEAT}
    assert schema_grammar(schema).count("(char") == MAX_REPEAT


def nested(depth: int) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "string"}
    for _ in range(depth):
        schema = {"type": "object", "properties": {"a": schema}}
    return schema


EMPTY_AT_ROOT = "an empty anyOf, enum or type list (at root) matches no value"
REFUSED = [
    ("not an object", [1], "a schema must be a JSON object, got [1]"),
    ("unknown type", {"type": "nonsense"}, "Unrecognized schema: {'type': 'nonsense'}"),
    (
        "a remote $ref is never fetched",
        {"$ref": "https://example.invalid/s.json"},
        "Fetching remote schemas is not allowed (use --allow-fetch for force)",
    ),
    (
        "maxLength over the limit",
        {"type": "string", "maxLength": MAX_REPEAT + 1},
        f'"maxLength" repeats {MAX_REPEAT + 1} times; the limit is {MAX_REPEAT}',
    ),
    (
        "minItems over the limit",
        {"type": "array", "items": {"type": "integer"}, "minItems": 10**9},
        f'"minItems" repeats 1e+09 times; the limit is {MAX_REPEAT}',
    ),
    (
        "a pattern bound over the limit, written as Python's int() reads it",
        {"type": "string", "pattern": "^a{2,1_001}$"},
        f'"pattern" repeats 1001 times; the limit is {MAX_REPEAT}',
    ),
    (
        "many bounded strings together",
        {
            "type": "object",
            "properties": {f"p{i}": {"type": "string", "maxLength": 900} for i in range(200)},
        },
        "its bounded repetitions (minLength, maxLength, minItems, maxItems, pattern {m,n}) "
        "would make too large a grammar",
    ),
    (
        "one bound behind long property names",
        {"type": "object", "properties": {"x" * 5000: {"type": "array", "maxItems": 500}}},
        "its bounded repetitions (minLength, maxLength, minItems, maxItems, pattern {m,n}) "
        "would make too large a grammar",
    ),
    (
        "too long",
        {"enum": ["x" * MAX_SCHEMA_CHARS]},
        f"it is over this server's limit of {MAX_SCHEMA_CHARS} characters",
    ),
    ("nested too deeply", nested(3000), "it nests too deeply, or has too many optional properties"),
    (
        "too many optional properties",
        {"type": "object", "properties": {f"p{i}": {"type": "null"} for i in range(3000)}},
        "it nests too deeply, or has too many optional properties",
    ),
    (
        "a pattern needing U+0000",
        {"type": "string", "pattern": "^a\\x00$"},
        "it needs a character that no token can produce (U+0000, a UTF-16 surrogate or one "
        'past U+10FFFF) in "a\\x00"',
    ),
    (
        "a raw U+0000 in a pattern",
        {"type": "string", "pattern": "^a\x00$"},
        "it needs a character that no token can produce (U+0000, a UTF-16 surrogate or one "
        'past U+10FFFF) in "a\x00"',
    ),
    (
        "a class of surrogates only",
        {"type": "string", "pattern": "^[\\ud800-\\udbff\\udc00]$"},
        "it needs a character that no token can produce (U+0000, a UTF-16 surrogate or one "
        "past U+10FFFF) in [\\ud800-\\udbff\\udc00]",
    ),
    (
        "a negative minItems (the converter writes out maxItems - minItems copies: -1e9 took all"
        " memory)",
        {"type": "array", "items": {"type": "integer"}, "minItems": -(10**5), "maxItems": 2},
        '"minItems" has a negative bound (-100000)',
    ),
    (
        "a negative bound in a pattern",
        {"type": "string", "pattern": "^a{-100000,2}$"},
        '"pattern" has a negative bound (-100000)',
    ),
    (
        "an empty anyOf (llama.cpp cannot parse the empty rule the converter writes)",
        {"anyOf": []},
        EMPTY_AT_ROOT,
    ),
    ("an empty type list", {"type": []}, EMPTY_AT_ROOT),
    ("an empty enum", {"enum": []}, EMPTY_AT_ROOT),
    (
        "an empty enum of a property",
        {"type": "object", "properties": {"a": {"enum": []}}},
        "an empty anyOf, enum or type list (at a) matches no value",
    ),
    (
        "a \\d in a pattern (the converter copies it; GBNF has no such escape)",
        {"type": "string", "pattern": "^\\d{5}$"},
        "the escape \\d in its pattern is not supported; write a character class instead "
        "([0-9] for \\d, [.] for \\., ...)",
    ),
    (
        "a \\. in a pattern's class",
        {"type": "string", "pattern": "^[a-z\\.]+$"},
        "the escape \\. in its pattern is not supported; write a character class instead "
        "([0-9] for \\d, [.] for \\., ...)",
    ),
    (
        "a ] that closes nothing in a pattern (the converter looped on it forever)",
        {"type": "string", "pattern": "^a]$"},
        "its pattern has a ] that closes nothing; escape it (\\])",
    ),
    (
        "a } that closes nothing in a pattern",
        {"type": "string", "pattern": "^a{2}}$"},
        "its pattern has a } that closes nothing; escape it (\\})",
    ),
    (
        "a code point past U+10FFFF",
        {"type": "string", "pattern": "^\\U00110000$"},
        "it needs a character that no token can produce (U+0000, a UTF-16 surrogate or one "
        'past U+10FFFF) in "\\U00110000"',
    ),
]


@pytest.mark.timeout(30)  # a refusal is immediate; the converter once looped forever on some
@pytest.mark.parametrize(
    ("schema", "message"), [c[1:] for c in REFUSED], ids=[c[0] for c in REFUSED]
)
def test_refused_schemas(schema: Any, message: str) -> None:
    with pytest.raises(GrammarError) as caught:
        schema_grammar(schema)
    assert str(caught.value) == message


@pytest.mark.parametrize(
    "pattern",
    ["^[\\x00-\\x7f]+$", "^a\\\\x00$", "^[^\\x00]$", "^\\u00e9$"],
    ids=["a class that also holds other characters", "an escaped backslash", "negated", "é"],
)
def test_patterns_that_tokens_can_produce(pattern: str) -> None:
    assert schema_grammar({"type": "string", "pattern": pattern})


LITERALS = [
    ("plain", "red", '"\\"red\\""'),
    ("quote", 'a"b', '"\\"a\\\\\\"b\\""'),
    ("backslash", "a\\b", '"\\"a\\\\\\\\b\\""'),
    ("newline", "a\nb", '"\\"a\\\\nb\\""'),
    ("U+0000", "a\x00b", '"\\"a\\\\u0000b\\""'),
    ("non-ASCII", "São", '"\\"São\\""'),
    ("lone surrogate", "\ud800", '"\\"\\\\ud800\\""'),
]


@pytest.mark.parametrize(
    ("value", "literal"), [c[1:] for c in LITERALS], ids=[c[0] for c in LITERALS]
)
def test_constants_become_gbnf_literals_of_their_json_text(value: str, literal: str) -> None:
    """The literal spells the value's JSON text: quotes and backslashes escaped for GBNF,
    control characters as JSON escapes, other characters as themselves (llama-cpp-python's
    own converter writes 'a"b' as a broken literal and "a\\nb" as a raw newline)."""
    assert schema_grammar({"const": value}) == f'root ::= {literal}\nspace ::= " "?'
    keyed = schema_grammar({"type": "object", "properties": {value: {"type": "null"}}})
    assert f"{literal} space" in keyed


def test_long_converter_messages_are_cut() -> None:
    with pytest.raises(GrammarError) as caught:
        schema_grammar({"type": "nonsense", "x": "y" * 500})
    assert len(str(caught.value)) == 200 and str(caught.value).endswith("…")


def test_either_renames_rules_apart() -> None:
    first = 'root ::= "a" x\nx ::= [a-z]{2,3} # x is "x"'
    second = 'root ::= "b\\"root" ( x )?\nx ::= [^\\]x]'
    assert either([first, second]) == (
        "root ::= g0-root | g1-root\n"
        'g0-root ::= "a" g0-x\ng0-x ::= [a-z]{2,3} # x is "x"\n'
        'g1-root ::= "b\\"root" ( g1-x )?\ng1-x ::= [^\\]x]'
    )


def test_either_of_one_grammar_is_that_grammar() -> None:
    assert either(["root ::= x"]) == "root ::= x"


def test_a_call_names_the_function_and_follows_its_parameters() -> None:
    parameters = {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 3}},
        "required": ["city"],
    }
    call = {
        "type": "object",
        "properties": {"name": {"const": "get_weather"}, "arguments": parameters},
        "required": ["name", "arguments"],
    }
    assert tool_call_grammar([("get_weather", parameters)]) == schema_grammar(call)


def test_several_functions_are_alternatives() -> None:
    gbnf = tool_call_grammar([("a", {"type": "object"}), ("b", {"type": "object"})])
    assert gbnf.startswith("root ::= g0-root | g1-root\n")
    assert 'g0-name ::= "\\"a\\""' in gbnf and 'g1-name ::= "\\"b\\""' in gbnf


def test_local_refs_of_the_parameters_still_resolve() -> None:
    parameters = {
        "type": "object",
        "$defs": {"Unit": {"enum": ["c", "f"]}},
        "properties": {"unit": {"$ref": "#/$defs/Unit"}},
    }
    assert 'Unit ::= "\\"c\\"" | "\\"f\\""' in tool_call_grammar([("t", parameters)])
    assert parameters["properties"]["unit"] == {"$ref": "#/$defs/Unit"}, "input untouched"


@pytest.mark.parametrize(
    "parameters",
    [
        {"type": "object", "properties": {"x": {"type": "nonsense"}}},
        {"type": "object", "properties": {"x": {"type": "string", "maxLength": 10**6}}},
        {"type": "string"},
        {"type": "object", "properties": {"x": {"$ref": "#/$defs/missing"}}},
        {"type": "object", "properties": {"x": {"enum": []}}},
        {"type": "object", "properties": {"zip": {"type": "string", "pattern": "^\\d{5}$"}}},
    ],
    ids=[
        "unconvertible",
        "too large",
        "not an object",
        "dangling ref",
        "empty enum",
        "pattern escape",
    ],
)
def test_arguments_fall_back_to_any_object(parameters: dict[str, Any]) -> None:
    fallback = tool_call_grammar([("f", {"type": "object"})])
    assert tool_call_grammar([("f", parameters)]) == fallback
    assert "object ::=" in fallback
