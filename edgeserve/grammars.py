"""GBNF grammars that constrain a chat answer: JSON matching a schema, or a forced tool call.

Pure text in, GBNF text out; the engine compiles the result. JSON schemas are converted by
llama-cpp-python's pure-Python converter (`llama_cpp.llama_grammar`, no native calls).

The converter writes out every bounded repetition (a `maxLength` of n is n nested groups), so
schemas whose bounds exceed MAX_REPEAT are refused before conversion, and so is any grammar
longer than MAX_GRAMMAR_CHARS. Every refusal is a GrammarError whose message says why.

A forced tool call is edgeserve's generic JSON format, `{"name": ..., "arguments": {...}}`
(the TOOLS_PREAMBLE format), which `edgeserve.tool_calls.parse_tool_calls` reads back.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any, Final

from llama_cpp.llama_grammar import JSON_GBNF, json_schema_to_gbnf

MAX_REPEAT: Final = 1000
"""The largest minLength/maxLength/minItems/maxItems (or pattern `{m,n}` bound) accepted;
llama.cpp refuses a little above it."""
MAX_SCHEMA_CHARS: Final = 100_000
"""The longest schema accepted, as JSON text."""
MAX_GRAMMAR_CHARS: Final = 1 << 20
"""The most text the bounded repetitions of one schema may expand to."""
ANY_JSON_OBJECT: Final = JSON_GBNF
"""Any JSON object (the grammar the engine uses for GrammarSpec("json_object"))."""

_BOUNDS: Final = ("minLength", "maxLength", "minItems", "maxItems")
_QUANTIFIER: Final = re.compile(r"\{([^}]*)\}")
# GBNF tokens: string literals, character classes, {m,n} bounds and comments are kept as they
# are; everything else that looks like a name is a rule name.
_GBNF_TOKEN: Final = re.compile(
    r'"(?:\\.|[^"\\])*"|\[(?:\\.|[^\]\\])*\]|\{[^}]*\}|#[^\n]*|(?P<name>[A-Za-z0-9-]+)'
)
_RULE_OVERHEAD: Final = 16
_ERROR_CHARS: Final = 200


class GrammarError(ValueError):
    """A schema that cannot be turned into a grammar; the message says why."""


def schema_grammar(schema: Any) -> str:
    """GBNF for JSON documents that match the JSON schema `schema` (a dict)."""
    if not isinstance(schema, dict):
        raise GrammarError(f"a schema must be a JSON object, got {_short(json.dumps(schema))}")
    try:
        text = json.dumps(schema)
        if len(text) > MAX_SCHEMA_CHARS:
            raise GrammarError(f"it is over this server's limit of {MAX_SCHEMA_CHARS} characters")
        if _repetition_cost(schema, 0) > MAX_GRAMMAR_CHARS:
            raise GrammarError(
                "its bounded repetitions (minLength, maxLength, minItems, maxItems, pattern "
                "{m,n}) would make too large a grammar"
            )
        return json_schema_to_gbnf(text)
    except GrammarError:
        raise
    except RecursionError as exc:
        raise GrammarError("it is nested too deeply") from exc
    except Exception as exc:  # the converter fails with assertions, KeyErrors, TypeErrors, ...
        raise GrammarError(_short(str(exc) or type(exc).__name__)) from exc


def tool_call_grammar(functions: Sequence[tuple[str, Mapping[str, Any]]]) -> str:
    """GBNF for exactly one call of one of `functions` ((name, parameters schema) pairs).

    The arguments follow the function's parameters schema when it describes an object and
    converts; otherwise they may be any JSON object.
    """
    return either([_call_grammar(name, parameters) for name, parameters in functions])


def either(grammars: Sequence[str]) -> str:
    """One grammar accepting what any of `grammars` accepts (their rules renamed apart)."""
    if len(grammars) == 1:
        return grammars[0]
    renamed = [_prefix_rules(gbnf, f"g{i}-") for i, gbnf in enumerate(grammars)]
    root = " | ".join(f"g{i}-root" for i in range(len(grammars)))
    return "\n".join([f"root ::= {root}", *renamed])


def _call_grammar(name: str, parameters: Mapping[str, Any]) -> str:
    if parameters.get("type", "object") == "object":
        try:
            return schema_grammar(_call_schema(name, _rebase_refs(parameters)))
        except (GrammarError, RecursionError):
            pass
    return schema_grammar(_call_schema(name, {"type": "object"}))


def _call_schema(name: str, arguments: Any) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {"name": {"const": name}, "arguments": arguments},
        "required": ["name", "arguments"],
    }


def _rebase_refs(value: Any) -> Any:
    """A copy of a parameters schema whose local `$ref`s ("#/...") point into the call schema,
    where the parameters sit at /properties/arguments."""
    if isinstance(value, list):
        return [_rebase_refs(item) for item in value]
    if not isinstance(value, Mapping):
        return value
    rebased = {key: _rebase_refs(item) for key, item in value.items()}
    ref = value.get("$ref")
    if isinstance(ref, str) and ref.startswith("#"):
        rebased["$ref"] = "#/properties/arguments" + ref[1:]
    return rebased


def _repetition_cost(value: Any, depth: int) -> int:
    """About how much grammar text the bounded repetitions in `value` expand to (each copy
    repeats a rule name that grows with the path, `depth` characters so far); GrammarError for
    a bound over MAX_REPEAT."""
    if isinstance(value, list):
        return sum(_repetition_cost(item, depth) for item in value)
    if not isinstance(value, dict):
        return 0
    cost = 0
    for key, item in value.items():
        bounds: list[float] = []
        if key in _BOUNDS and isinstance(item, int | float):
            bounds = [item]
        elif key == "pattern" and isinstance(item, str):
            bounds = [_quantifier_bound(match.group(1)) for match in _QUANTIFIER.finditer(item)]
        for bound in bounds:
            if bound > MAX_REPEAT:
                raise GrammarError(f'"{key}" repeats {bound:g} times; the limit is {MAX_REPEAT}')
            width = depth + _RULE_OVERHEAD + (len(item) if isinstance(item, str) else 0)
            cost += int(bound) * width
        cost += _repetition_cost(item, depth + len(key) + 1)
    return cost


def _quantifier_bound(body: str) -> float:
    """The largest number in a regex quantifier body ("3", "2,", "1,5"), read as the converter
    reads it; 0 when it has none."""
    numbers = []
    for part in body.split(","):
        try:
            numbers.append(int(part.strip()))
        except ValueError:
            continue
    return max(numbers, default=0)


def _prefix_rules(gbnf: str, prefix: str) -> str:
    """`gbnf` with every rule name prefixed (literals, classes and comments untouched)."""

    def rename(match: re.Match[str]) -> str:
        return prefix + match.group(0) if match.group("name") else match.group(0)

    return _GBNF_TOKEN.sub(rename, gbnf)


def _short(text: str) -> str:
    return text if len(text) <= _ERROR_CHARS else text[: _ERROR_CHARS - 1] + "…"
