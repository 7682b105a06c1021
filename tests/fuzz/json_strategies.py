"""Hypothesis strategies for structurally plausible JSON: recursive values built from the wire
models' own field names and the values clients and models really send, edge values (huge and
negative numbers, NaN, lone surrogates, template and tool-call markers), mutations of a valid
document (a field replaced, removed, added, duplicated or retyped), and the document's text,
sometimes with its bytes cut or corrupted."""

from __future__ import annotations

import copy
import functools
import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from hypothesis import strategies as st
from pydantic import BaseModel

from edgeserve.api.anthropic_messages import wire as anthropic_wire
from edgeserve.api.common import wire as common_wire
from edgeserve.api.embeddings import wire as embeddings_wire
from edgeserve.api.lora_adapters import wire as lora_wire
from edgeserve.api.openai_chat import wire as chat_wire
from edgeserve.api.openai_completions import wire as completions_wire
from edgeserve.api.openai_responses import wire as responses_wire
from edgeserve.api.score import wire as score_wire
from edgeserve.api.tokenize import wire as tokenize_wire

Path = tuple[str | int, ...]


@dataclass(frozen=True)
class RawJson:
    """JSON text put into a document as it is (numbers Python cannot write, NaN, deep nests)."""

    text: str


def _wire_field_names() -> list[str]:
    """Every field name (and alias) of every wire model, so that generated objects use the
    names the server reads."""
    names = {"lora", "id", "scale", "type", "properties", "required", "items", "enum", "const"}
    for module in (
        anthropic_wire,
        common_wire,
        embeddings_wire,
        lora_wire,
        chat_wire,
        completions_wire,
        responses_wire,
        score_wire,
        tokenize_wire,
    ):
        for value in vars(module).values():
            if isinstance(value, type) and issubclass(value, BaseModel):
                for name, info in value.model_fields.items():
                    names.add(name)
                    if info.alias:
                        names.add(info.alias)
    return sorted(names)


FIELD_NAMES = _wire_field_names()

EDGE_INTS = [
    0,
    1,
    2,
    -1,
    -2,
    255,
    256,
    262143,
    262144,
    2**31 - 1,
    2**31,
    -(2**31) - 1,
    2**53 + 1,
    2**63 - 1,
    2**63,
    2**64,
    -(2**63) - 1,
    10**30,
]
EDGE_FLOATS = [0.0, -0.0, 0.5, 1.5, -1.0, 1e-320, 1e308, -1e308, 2.0**64, 100.0, -100.0]
RAW_ATOMS = [
    "NaN",
    "Infinity",
    "-Infinity",
    "1e999",
    "-1e999",
    "1e-999",
    "1" * 4301,
    "-" + "9" * 5000,
    "1." + "0" * 5000 + "1",
    "[" * 900 + "]" * 900,
    '{"a":' * 900 + "0" + "}" * 900,
    "[" * 3000 + "]" * 3000,
    '{"a":' * 1500 + "0" + "}" * 1500,
]
WORDS = [
    "",
    " ",
    "user",
    "assistant",
    "system",
    "tool",
    "function",
    "developer",
    "text",
    "image_url",
    "video_url",
    "audio_url",
    "input_audio",
    "input_text",
    "input_image",
    "message",
    "function_call",
    "function_call_output",
    "tool_use",
    "tool_result",
    "image",
    "base64",
    "url",
    "auto",
    "any",
    "none",
    "required",
    "json_object",
    "json_schema",
    "object",
    "array",
    "string",
    "integer",
    "number",
    "boolean",
    "null",
    "float",
    "mean",
    "sum",
    "#/properties/a",
    "#/$defs/x",
    "#",
    "^[a-z]{2,5}$",
    "(a|b)*c{1000,}",
    "date-time",
    "uuid",
    "gemma-test",
    "hi",
    "<start_of_turn>",
    "<end_of_turn>",
    "<bos>",
    "<eos>",
    "<pad>",
    "<start_of_image>",
    "<__media__>",
    "<tool_call>",
    "</tool_call>",
    "[TOOL_CALLS]",
    "Action: f\nAction Input: {}",
    '{"name": "f", "arguments": {}}',
    "{{ raise_exception('x') }}",
    "{% for x in range(99999999) %}",
    "data:image/png;base64,",
    "data:image/png;base64,AAAA",
    "data:image/webp;base64,UklGRg==",
    "data:audio/wav;base64,UklGRg==",
    "data:video/mp4;base64,AAAA",
    "http://example.invalid/a.png",
    "https://127.0.0.1:1/x.png",
    "ftp://example.invalid/x",
    "file:///etc/passwd",
    "/etc/passwd",
    "/dev/zero",
    "../../etc/hosts",
    "\x00",
    "\ud800",
    "\udfff",
    "a\ud83d",
    "\u2028\u2029",
    "\ufeff",
    "\U0010ffff",
    "\x7f\x1b[0m",
]


def pick(values: list[Any]) -> st.SearchStrategy[Any]:
    """One of `values` (as sampled_from, with a short repr: Hypothesis warns about long ones)."""
    return st.integers(0, len(values) - 1).map(values.__getitem__)


keys = st.one_of(pick(FIELD_NAMES), pick(WORDS), st.text(max_size=8))
strings = st.one_of(
    pick(WORDS),
    st.text(max_size=24),
    st.text(st.characters(codec="utf-8"), max_size=12),
    st.lists(pick(WORDS), min_size=2, max_size=4).map("".join),
)
numbers = st.one_of(
    pick(EDGE_INTS),
    st.integers(-10, 300),
    st.integers(),
    pick(EDGE_FLOATS),
    st.floats(allow_nan=False, allow_infinity=False),
)
scalars = st.one_of(st.none(), st.booleans(), numbers, strings)
atoms = st.one_of(scalars, pick(RAW_ATOMS).map(RawJson))


@functools.cache
def _json_values(max_leaves: int) -> st.SearchStrategy[Any]:
    return st.recursive(
        atoms,
        lambda children: st.one_of(
            st.lists(children, max_size=4),
            st.dictionaries(keys, children, max_size=4),
        ),
        max_leaves=max_leaves,
    )


@st.composite
def json_values(draw: st.DrawFn, max_leaves: int = 12) -> Any:
    """Recursive JSON: objects keyed by wire field names, lists, plausible scalars and raw
    atoms (a composite, so that strategies built from it keep a short repr)."""
    return draw(_json_values(max_leaves))


def paths(doc: Any, prefix: Path = ()) -> Iterator[Path]:
    """The path of every node of `doc` (the root first)."""
    yield prefix
    if isinstance(doc, dict):
        for key, value in doc.items():
            yield from paths(value, (*prefix, key))
    elif isinstance(doc, list):
        for index, value in enumerate(doc):
            yield from paths(value, (*prefix, index))


def node_at(doc: Any, path: Path) -> Any:
    """The node of `doc` at `path`."""
    for step in path:
        doc = doc[step]
    return doc


def replaced(doc: Any, path: Path, value: Any) -> Any:
    """`doc` with the node at `path` replaced by `value` (in place; the root is returned)."""
    if not path:
        return value
    node_at(doc, path[:-1])[path[-1]] = value
    return doc


def _retyped(value: Any) -> list[Any]:
    """Plausible wrong types for `value`: as a list, an object, a string, a number."""
    out: list[Any] = [[value], {"type": value}, None, True]
    if isinstance(value, str):
        out += [len(value), {"text": value}, value * 3, value[: len(value) // 2]]
    elif isinstance(value, bool):
        out += ["true", 1]
    elif isinstance(value, int | float):
        out += [str(value), float(value), -value, value * 1000]
    elif isinstance(value, list):
        out += [value[:1], value * 3, json.dumps(_plain(value))]
    elif isinstance(value, dict):
        out += [list(value.values()), list(value), json.dumps(_plain(value))]
    return out


def _plain(value: Any) -> Any:
    """`value` with raw atoms as their text (for turning a subtree into a JSON string)."""
    if isinstance(value, RawJson):
        return value.text
    if isinstance(value, dict):
        return {key: _plain(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_plain(item) for item in value]
    return value


@st.composite
def _mutation(draw: st.DrawFn, doc: Any) -> Any:
    """One mutation at one node of `doc` (which it may change in place)."""
    all_paths = list(paths(doc))
    path = draw(st.sampled_from(all_paths))
    node = node_at(doc, path)
    operations: list[str] = ["replace", "retype"]
    if path:
        operations.append("delete")
    if isinstance(node, dict):
        operations.append("add-key")
    if isinstance(node, list):
        operations += ["insert", "repeat"] if node else ["insert"]
    if isinstance(node, str):
        operations.append("splice")
    operation = draw(st.sampled_from(operations))
    if operation == "replace":
        return replaced(doc, path, draw(json_values()))
    if operation == "retype":
        return replaced(doc, path, draw(st.sampled_from(_retyped(node))))
    if operation == "delete":
        parent = node_at(doc, path[:-1])
        del parent[path[-1]]
        return doc
    if operation == "add-key":
        node[draw(keys)] = draw(json_values(6))
        return doc
    if operation == "insert":
        item = draw(st.one_of(json_values(6), pick(node))) if node else draw(atoms)
        node.insert(draw(st.integers(0, len(node))), copy.deepcopy(item))
        return doc
    if operation == "repeat":
        times = draw(st.sampled_from([2, 3, 10, 200]))
        node.extend(copy.deepcopy(node) * (times - 1))
        return doc
    cut = draw(st.integers(0, len(node)))
    return replaced(doc, path, node[:cut] + draw(strings) + node[cut:])


MAX_DOCUMENT_CHARS = 200_000
"""A mutation that would make a document longer than this (repeated repeats) is dropped."""


@st.composite
def mutated(draw: st.DrawFn, examples: list[Any], max_mutations: int = 3) -> Any:
    """One of `examples`, deep-copied, with 0 to `max_mutations` mutations."""
    doc = copy.deepcopy(draw(pick(examples)))
    for _ in range(draw(st.integers(0, max_mutations))):
        changed = draw(_mutation(copy.deepcopy(doc)))
        if len(to_json(changed)) <= MAX_DOCUMENT_CHARS:
            doc = changed
    return doc


def to_json(value: Any) -> str:
    """JSON text of `value` (raw atoms as they are; NaN and infinities as Python writes them;
    strings ASCII-escaped, so a lone surrogate travels as its `\\u` escape)."""
    if isinstance(value, RawJson):
        return value.text
    if isinstance(value, dict):
        members = (f"{json.dumps(str(key))}:{to_json(item)}" for key, item in value.items())
        return "{" + ",".join(members) + "}"
    if isinstance(value, list):
        return "[" + ",".join(to_json(item) for item in value) + "]"
    return json.dumps(value)


def _flip(data: bytes, position: int, byte: int) -> bytes:
    return data[:position] + bytes([byte]) + data[position + 1 :]


@st.composite
def corrupted(draw: st.DrawFn, data: bytes) -> bytes:
    """`data`, mostly as it is, else cut short, a byte changed, bytes inserted or a span
    doubled."""
    how = draw(st.sampled_from(["same"] * 6 + ["cut", "flip", "insert", "double"]))
    if how == "same" or not data:
        return data
    position = draw(st.integers(0, len(data) - 1))
    if how == "cut":
        return data[:position]
    if how == "flip":
        return _flip(data, position, draw(st.integers(0, 255)))
    if how == "insert":
        return data[:position] + draw(st.binary(min_size=1, max_size=8)) + data[position:]
    end = draw(st.integers(position, len(data)))
    return data[:end] + data[position:end] + data[end:]


_UNDECODABLE = object()


def _decoded(text: str) -> Any:
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        return _UNDECODABLE


def as_decoded(values: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """`values` as the server holds them once their JSON text is decoded (raw atoms read as
    Python reads them; values Python cannot decode left out)."""
    return values.map(to_json).map(_decoded).filter(lambda value: value is not _UNDECODABLE)
