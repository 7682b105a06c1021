"""GBNF grammars that constrain a chat answer: JSON matching a schema, or a forced tool call.

Pure text in, GBNF text out; the engine compiles the result. JSON schemas are converted by
llama-cpp-python's pure-Python converter (`llama_cpp.llama_grammar`, no native calls).

The converter writes out every bounded repetition (a `maxLength` of n is n nested groups), so
schemas whose bounds exceed MAX_REPEAT, or that would expand past MAX_GRAMMAR_CHARS, are refused
before conversion. So is a grammar that could demand a character no token produces (U+0000, a
UTF-16 surrogate): no answer could ever be produced (the engine would end it empty). Every
refusal is a GrammarError whose message says why.

A forced tool call is edgeserve's generic JSON format, `{"name": ..., "arguments": {...}}`
(the TOOLS_PREAMBLE format), which `edgeserve.tool_calls.parse_tool_calls` reads back.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any, Final

from llama_cpp.llama_grammar import SchemaConverter

MAX_REPEAT: Final = 1000
"""The largest minLength/maxLength/minItems/maxItems (or pattern `{m,n}` bound) accepted;
llama.cpp refuses a little above it."""
MAX_SCHEMA_CHARS: Final = 100_000
"""The longest schema accepted, as JSON text."""
MAX_GRAMMAR_CHARS: Final = 1 << 20
"""The most text the bounded repetitions of one schema may expand to."""
JSON_STRING_CHAR: Final = (
    r'[^"\\\x7F\x00-\x1F] | "\\" (["\\/bfnrt] | "u" ' + " ".join(["[0-9a-fA-F]"] * 4) + ")"
)
"""One character of a JSON string: anything but a quote, a backslash or a control character
(which JSON requires escaped), or an escape. llama-cpp-python's converter lets control
characters through, so its grammars accept strings with raw newlines that no JSON parser reads."""
PATTERN_DOT: Final = r'[^"\\\x7F\x00-\x1F]'
"""What `.` in a schema's `pattern` matches inside the JSON string: one character that needs no
escape (the converter's own dot also allows quotes, backslashes and control characters)."""

_BOUNDS: Final = ("minLength", "maxLength", "minItems", "maxItems")
_QUANTIFIER: Final = re.compile(r"\{([^}]*)\}")
# GBNF tokens: string literals, character classes, {m,n} bounds and comments are kept as they
# are; everything else that looks like a name is a rule name.
_GBNF_TOKEN: Final = re.compile(
    r'"(?:\\.|[^"\\])*"|\[(?:\\.|[^\]\\])*\]|\{[^}]*\}|#[^\n]*|(?P<name>[A-Za-z0-9-]+)'
)
_ESCAPE: Final = re.compile(
    r"\\(?:x([0-9a-fA-F]{2})|u([0-9a-fA-F]{4})|U([0-9a-fA-F]{8})|(.))", re.S
)
_SIMPLE_ESCAPES: Final = {"n": 10, "r": 13, "t": 9}
_SURROGATE: Final = re.compile("[\ud800-\udfff]")
_PATTERN_ESCAPE: Final = re.compile(r"\\(.?)", re.S)
# Escapes that GBNF also has (the converter copies them), and regex escapes of the characters
# that the converter unescapes itself.
_PATTERN_ESCAPES_KEPT: Final = frozenset('xuUtrn\\"[]') | frozenset("(){}|*+?")
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
        gbnf = _convert(text)
    except GrammarError:
        raise
    except RecursionError as exc:
        raise GrammarError("it nests too deeply, or has too many optional properties") from exc
    except Exception as exc:  # the converter fails with assertions, KeyErrors, TypeErrors, ...
        raise GrammarError(_short(str(exc) or type(exc).__name__)) from exc
    _check_reachable(gbnf)
    return gbnf


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


class _Converter(SchemaConverter):
    """llama-cpp-python's converter with its JSON literals (constants, enum values, property
    names) escaped for GBNF. Its own passes the JSON text's escapes to GBNF as they are, so a
    quote breaks the grammar, a backslash or newline gives other or invalid JSON, and a NUL
    demands a character no token produces."""

    def _add_rule(self, name: str, rule: str) -> str:
        """The converter's rules, with its JSON string character and pattern dot made strict.
        GrammarError for a rule that matches nothing: the converter writes an empty `anyOf`,
        `enum` or `type` list as an empty rule, which is not GBNF (llama.cpp refuses it)."""
        if not rule.strip():
            raise GrammarError(f"an empty anyOf, enum or type list (at {name}) matches no value")
        if name == "char":
            rule = JSON_STRING_CHAR
        elif name == "dot":
            rule = PATTERN_DOT
        return super()._add_rule(name, rule)

    def _visit_pattern(self, pattern: str, name: str) -> str:
        """GrammarError for a regex escape that the converter copies into the grammar as it
        is but GBNF does not have (`\\d`, `\\.`, `\\-`, ...): llama.cpp would refuse the
        whole grammar; and for a `]` or `}` that closes nothing, on which the converter loops
        forever."""
        for match in _PATTERN_ESCAPE.finditer(pattern):
            if match.group(1) not in _PATTERN_ESCAPES_KEPT:
                raise GrammarError(
                    f"the escape {match.group(0)} in its pattern is not supported; write a "
                    "character class instead ([0-9] for \\d, [.] for \\., ...)"
                )
        stray = _stray_closer(pattern)
        if stray:
            raise GrammarError(
                f"its pattern has a {stray} that closes nothing; escape it (\\{stray})"
            )
        return super()._visit_pattern(pattern, name)

    def _format_literal(self, literal: str) -> str:
        readable = json.dumps(json.loads(literal), ensure_ascii=False)
        text = _SURROGATE.sub(lambda match: f"\\u{ord(match.group(0)):04x}", readable)
        return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _convert(schema_text: str) -> str:
    """What llama-cpp-python's `json_schema_to_gbnf` does, with the fixed converter."""
    converter = _Converter(prop_order={}, allow_fetch=False, dotall=False, raw_pattern=False)
    schema = converter.resolve_refs(json.loads(schema_text), "stdin")
    converter.visit(schema, "")
    return converter.format_grammar()


ANY_JSON_OBJECT: Final = _convert('{"type": "object"}')
"""Any JSON object: the grammar the engine uses for GrammarSpec("json_object") (not
llama-cpp-python's JSON_GBNF, whose newline-and-indent whitespace made sampling ~8x slower)."""


def _check_reachable(gbnf: str) -> None:
    """GrammarError when a literal, or a character class that is not negated, needs a
    character that no token can produce."""
    for match in _GBNF_TOKEN.finditer(gbnf):
        token = match.group(0)
        if token.startswith('"'):
            dead = any(_unreachable(code, code) for code, _ in _code_points(token[1:-1]))
        elif token.startswith("[") and not token.startswith("[^"):
            ranges = _class_ranges(token[1:-1])
            dead = bool(ranges) and all(_unreachable(low, high) for low, high in ranges)
        else:
            continue
        if dead:
            raise GrammarError(
                f"it needs a character that no token can produce (U+0000, a UTF-16 surrogate or "
                f"one past U+10FFFF) in {_short(token)}"
            )


def _unreachable(low: int, high: int) -> bool:
    """Whether no token can produce any code point in low..high: each is U+0000, a UTF-16
    surrogate or past U+10FFFF (or the range is empty)."""
    return low > high or low == high == 0 or 0xD800 <= low <= high <= 0xDFFF or low > 0x10FFFF


def _code_points(body: str) -> list[tuple[int, bool]]:
    """The characters of a GBNF literal or class body, with whether each was escaped."""
    out = []
    position = 0
    while position < len(body):
        if body[position] != "\\":
            out.append((ord(body[position]), False))
            position += 1
            continue
        match = _ESCAPE.match(body, position)
        if match is None:
            out.append((ord("\\"), False))
            position += 1
            continue
        hex_digits = match.group(1) or match.group(2) or match.group(3)
        plain = match.group(4)
        code = int(hex_digits, 16) if hex_digits else _SIMPLE_ESCAPES.get(plain, ord(plain))
        out.append((code, True))
        position = match.end()
    return out


def _class_ranges(body: str) -> list[tuple[int, int]]:
    """A character class body as (low, high) ranges."""
    items = _code_points(body)
    ranges = []
    index = 0
    while index < len(items):
        low = items[index][0]
        if index + 2 < len(items) and items[index + 1] == (ord("-"), False):
            ranges.append((low, items[index + 2][0]))
            index += 3
        else:
            ranges.append((low, low))
            index += 1
    return ranges


def _stray_closer(pattern: str) -> str | None:
    """The first `]` or `}` of `pattern` outside a character class, a `{m,n}` bound and an
    escape, read as the converter reads them; None when there is none."""
    position = 0
    while position < len(pattern):
        char = pattern[position]
        if char == "\\":
            position += 2
            continue
        if char in "]}":
            return char
        if char in "[{":
            closer = "]" if char == "[" else "}"
            position += 1
            while position < len(pattern) and pattern[position] != closer:
                position += 2 if char == "[" and pattern[position] == "\\" else 1
        position += 1
    return None


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
            if bound < 0:  # the converter writes out max - min copies: a grammar without limit
                raise GrammarError(f'"{key}" has a negative bound ({bound:g})')
            width = depth + _RULE_OVERHEAD + (len(item) if isinstance(item, str) else 0)
            cost += int(bound) * width
        cost += _repetition_cost(item, depth + len(key) + 1)
    return cost


def _quantifier_bound(body: str) -> float:
    """The largest number in a regex quantifier body ("3", "2,", "1,5"), read as the converter
    reads it, or its smallest when that is negative; 0 when it has none."""
    numbers = []
    for part in body.split(","):
        try:
            numbers.append(int(part.strip()))
        except ValueError:
            continue
    return min(numbers) if numbers and min(numbers) < 0 else max(numbers, default=0)


def _prefix_rules(gbnf: str, prefix: str) -> str:
    """`gbnf` with every rule name prefixed (literals, classes and comments untouched)."""

    def rename(match: re.Match[str]) -> str:
        return prefix + match.group(0) if match.group("name") else match.group(0)

    return _GBNF_TOKEN.sub(rename, gbnf)


def _short(text: str) -> str:
    return text if len(text) <= _ERROR_CHARS else text[: _ERROR_CHARS - 1] + "…"
