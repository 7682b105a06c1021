"""Hypothesis strategies for JSON schemas as clients send them in response formats and tool
parameters: recursive schemas of the keywords the converter reads (types, properties, items,
unions, references, bounds, patterns, formats, constants), mutated valid schemas, and regular
expressions built from the pieces the converter's pattern parser handles (and some it does not)."""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

from tests.fuzz.bodies import SCHEMAS
from tests.fuzz.json_strategies import json_values, keys, mutated, strings

TYPES = ["string", "integer", "number", "boolean", "null", "object", "array", "unknown"]
FORMATS = ["date", "time", "date-time", "uuid", "email", "uri", ""]
REGEX_PIECES = [
    "a",
    "b",
    "ab",
    ".",
    "\\d",
    "\\w",
    "\\s",
    "\\.",
    "\\\\",
    "\\u00e9",
    "\\x00",
    "[a-z]",
    "[^a]",
    "[]",
    "[\\]]",
    "[z-a]",
    "[\\ud800-\\udfff]",
    "(",
    ")",
    "(?:",
    "(?=",
    "|",
    "*",
    "+",
    "?",
    "*?",
    "{2}",
    "{1,3}",
    "{,2}",
    "{3,}",
    "{0}",
    "{1000}",
    "{999,1000}",
    "{2,1}",
    "{a}",
    "^",
    "$",
    '"',
    "é",
    "\x00",
]
_regex_bodies = st.lists(st.sampled_from(REGEX_PIECES), max_size=10).map("".join)
patterns = st.one_of(_regex_bodies.map(lambda body: f"^{body}$"), _regex_bodies)
"""Regular expressions, mostly anchored (the converter refuses a pattern without ^ and $)."""
bounds = st.one_of(st.integers(-2, 12), st.sampled_from([0.5, 999, 1000, 1001, 10**9, -(10**9)]))
refs = st.sampled_from(
    [
        "#",
        "#/",
        "#/$defs/a",
        "#/definitions/a",
        "#/properties/a",
        "#/$defs/missing",
        "a",
        "#/$defs/a/b",
        "https://x.invalid/s.json",
    ]
)

leaf_schemas = st.one_of(
    st.builds(lambda kind: {"type": kind}, st.sampled_from(TYPES)),
    st.builds(lambda kinds: {"type": kinds}, st.lists(st.sampled_from(TYPES), max_size=3)),
    st.builds(lambda value: {"const": value}, json_values(4)),
    st.builds(lambda values: {"enum": values}, st.lists(json_values(3), max_size=4)),
    st.builds(
        lambda pattern, low, high: {
            "type": "string",
            "pattern": pattern,
            "minLength": low,
            "maxLength": high,
        },
        patterns,
        bounds,
        bounds,
    ),
    st.builds(lambda fmt: {"type": "string", "format": fmt}, st.sampled_from(FORMATS)),
    st.builds(
        lambda kind, low, high: {"type": kind, "minimum": low, "maximum": high},
        st.sampled_from(["integer", "number"]),
        bounds,
        bounds,
    ),
    st.builds(lambda ref: {"$ref": ref}, refs),
    st.just({}),
    st.booleans(),
)


def _composite(children: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    properties = st.dictionaries(st.one_of(keys, strings), children, max_size=4)
    return st.one_of(
        st.builds(
            lambda props, required, extra: {
                "type": "object",
                "properties": props,
                "required": required,
                "additionalProperties": extra,
            },
            properties,
            st.lists(st.one_of(keys, strings), max_size=3),
            st.one_of(st.booleans(), children),
        ),
        st.builds(
            lambda items, low, high: {
                "type": "array",
                "items": items,
                "minItems": low,
                "maxItems": high,
            },
            children,
            bounds,
            bounds,
        ),
        st.builds(
            lambda items: {"type": "array", "prefixItems": items}, st.lists(children, max_size=3)
        ),
        st.builds(
            lambda key, options: {key: options},
            st.sampled_from(["anyOf", "oneOf", "allOf"]),
            st.lists(children, max_size=3),
        ),
        st.builds(
            lambda defs, ref: {"$defs": defs, "$ref": ref},
            st.dictionaries(st.sampled_from(["a", "b"]), children, max_size=2),
            refs,
        ),
        st.builds(
            lambda schema, extra: {**schema, **extra} if isinstance(schema, dict) else schema,
            children,
            st.dictionaries(keys, json_values(3), max_size=2),
        ),
    )


_SCHEMAS = st.one_of(st.recursive(leaf_schemas, _composite, max_leaves=8), mutated(SCHEMAS))


@st.composite
def schemas(draw: st.DrawFn) -> Any:
    """JSON schemas (mostly objects; some are not, as clients also send)."""
    return draw(_SCHEMAS)
