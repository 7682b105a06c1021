"""The grammar of a JSON answer (any object, or a JSON schema's documents), shared by the APIs
that ask for one: OpenAI's `response_format` and Ollama's `format`. With tools the model may
call, the answer is either one call or JSON in that format."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from edgeserve import grammars
from edgeserve.api.reference.limits import bad, check_unicode
from edgeserve.engine.types import GrammarSpec


def json_answer_grammar(
    schema: dict[str, Any] | None,
    tools: Sequence[tuple[str, Mapping[str, Any]]],
    *,
    unusable: str,
    field: str,
) -> GrammarSpec:
    """Any JSON object (`schema` None) or JSON matching `schema`; with `tools` ((name,
    parameters schema) pairs the model may call), a call of one of them or that. A schema the
    converter cannot use is a 400 with `unusable` (a template of `{error}`); `field` names
    the schema in the Unicode check of its grammar. Slow for a large schema: call it off the
    event loop."""
    if schema is None:
        answer, text = GrammarSpec("json_object"), grammars.ANY_JSON_OBJECT
    else:
        try:
            text = grammars.schema_grammar(schema)
        except grammars.GrammarError as exc:
            raise bad(unusable.format(error=exc)) from exc
        check_unicode([(field, text)])
        answer = GrammarSpec("gbnf", text)
    if not tools:
        return answer
    return GrammarSpec("gbnf", grammars.either([grammars.tool_call_grammar(tools), text]))
