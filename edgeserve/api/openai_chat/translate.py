"""POST /v1/chat/completions: the schema, every chat check in the reference's order, then
edgeserve's own (tool_choice, sampling, response_format, Unicode) and the output grammar."""

from __future__ import annotations

import asyncio
import json
from dataclasses import replace
from typing import Any

from edgeserve import errors, grammars
from edgeserve.api.common.media import PendingTurn, flatten, read_turns, taken_media
from edgeserve.api.common.output_grammar import json_answer_grammar
from edgeserve.api.common.sampling import MAX_TOP_LOGPROBS, check_range, sampling_params
from edgeserve.api.common.wire import MultimodalInputItem, Role
from edgeserve.api.openai_chat.wire import (
    ChatCompletionRequest,
    ChatCompletionRequestWithAudio,
    ChatMessage,
    FunctionAvailable,
    FunctionDefinition,
    ResponseFormat,
)
from edgeserve.api.reference.detail import Detail
from edgeserve.api.reference.limits import Limits, bad, check_unicode
from edgeserve.api.reference.request import parse_body
from edgeserve.engine.types import (
    ChatPrompt,
    GenerationRequest,
    GrammarSpec,
    SamplingParams,
)


def parse_chat_request(body: Any, *, audio: bool = False) -> ChatCompletionRequest:
    """Validate a decoded body against the chat schema (with `audio`, the one whose items may
    also be `input_audio`); 422 with every error, FastAPI-shaped."""
    return parse_body(ChatCompletionRequestWithAudio if audio else ChatCompletionRequest, body)


async def prepare_chat(req: ChatCompletionRequest, limits: Limits) -> GenerationRequest:
    """Run every chat check in the reference's order and build the engine request.

    Order: Invalid length; system pop; Only supports u/a/u/a/u...; per message the role check
    then content processing (media checks E7–E13; a host name is looked up, E11/E12, only for
    media the model takes in a request within the media limit: README divergence 21); tools;
    if streaming, "Cannot stream multiple responses." (tools stream, README divergence 10: the
    reference's "Cannot stream function calls." is never sent); then edgeserve's own checks,
    which replace errors the reference only hits in its engine (null content, media the model
    does not take), then tool_choice, sampling values and limits (logprobs included),
    response_format, invalid Unicode, the output grammar (a forced tool call or the response
    format) and last the media read (count and size limits, files and downloads; see
    api/common/media.py).

    ChatTurn roles are the OpenAI names user/assistant/tool/function: "tool" is a tool result
    (the reference's "observation"), and "function" is the assistant's own tool calls, with the
    content `[{"name": ..., "arguments": "<json string>"}, ...]` (reference section 5.3).
    """
    messages = list(req.messages)
    if not messages:
        raise bad(Detail.INVALID_LENGTH)
    system: str | None = None
    offset = 0
    if messages[0].role is Role.SYSTEM:
        system = _system_prompt(messages.pop(0))
        offset = 1
    if len(messages) % 2 == 0:
        raise bad(Detail.ONLY_UAUAU)
    late: list[str] = []
    turns: list[PendingTurn] = []
    items = (item for message in messages for item in _items(message) or ())
    lookups = taken_media(items, limits) <= limits.max_media_items
    for position, message in enumerate(messages):
        _check_role(position, message.role)
        turns.append(await _turn(message, position + offset, limits, late, lookups))
    tools = _serialize_tools(req.tools)
    if req.stream and req.n > 1:
        raise bad(Detail.CANNOT_STREAM_N)
    if late:
        raise bad(late[0])
    forced = _forced_functions(req)
    params = _chat_params(req, limits)
    schema = _response_schema(req.response_format)
    check_unicode(
        [
            ("model", req.model),
            ("the system message", system),
            *((f"messages[{i + offset}]", turn.content) for i, turn in enumerate(turns)),
            ("tools", tools),
            *(("stop", text) for text in params.stop),
        ]
    )
    grammar = None
    if forced or _format_kind(req) != "text":
        grammar = await asyncio.to_thread(_grammar, req, forced, schema)
    prompt = ChatPrompt(messages=await read_turns(turns, limits), system=system, tools=tools)
    return GenerationRequest(prompt=prompt, params=replace(params, grammar=grammar), n=req.n)


def tool_calls_wanted(req: ChatCompletionRequest) -> bool:
    """Whether the answer is parsed for tool calls: the request has tools and `tool_choice` is
    not "none" (the tools are still shown to the model then, as OpenAI does)."""
    return bool(req.tools) and req.tool_choice != "none"


def _forced_functions(req: ChatCompletionRequest) -> list[FunctionDefinition] | None:
    """The functions `tool_choice` forces the answer to call one of: all of them for
    "required", one for a named function; None when no call is forced (absent, "none",
    "auto"). 400 for a malformed value, a forced call without tools or an unknown name."""
    choice = req.tool_choice
    if choice is None or choice in ("none", "auto"):
        return None
    value = json.dumps(choice, ensure_ascii=False)
    named = (
        isinstance(choice, dict)
        and choice.get("type") == "function"
        and isinstance(choice.get("function"), dict)
        and isinstance(choice["function"].get("name"), str)
    )
    if choice != "required" and not named:
        raise bad(Detail.TOOL_CHOICE_INVALID.format(value=value))
    functions = _functions(req)
    if not functions:
        raise bad(Detail.TOOL_CHOICE_WITHOUT_TOOLS.format(value=value))
    if not named:
        return functions
    name = choice["function"]["name"]
    chosen = [function for function in functions if function.name == name]
    if not chosen:
        known = ", ".join(json.dumps(f.name, ensure_ascii=False) for f in functions)
        raise bad(
            Detail.TOOL_CHOICE_UNKNOWN_FUNCTION.format(
                name=json.dumps(name, ensure_ascii=False), known=known
            )
        )
    return chosen[:1]


def _response_schema(response_format: ResponseFormat | None) -> dict[str, Any] | None:
    """The JSON schema of a "json_schema" response format (None for other types); 400 when
    the schema object is missing."""
    if response_format is None or response_format.type != "json_schema":
        return None
    if not response_format.json_schema:
        raise bad(Detail.JSON_SCHEMA_MISSING)
    schema = response_format.json_schema.get("schema")
    if not isinstance(schema, dict):
        raise bad(Detail.JSON_SCHEMA_WITHOUT_SCHEMA)
    return schema


def _functions(req: ChatCompletionRequest) -> list[FunctionDefinition]:
    return [tool.function for tool in req.tools or () if tool.function is not None]


def _format_kind(req: ChatCompletionRequest) -> str:
    return req.response_format.type if req.response_format else "text"


def _grammar(
    req: ChatCompletionRequest,
    forced: list[FunctionDefinition] | None,
    schema: dict[str, Any] | None,
) -> GrammarSpec | None:
    """The grammar the answer must follow. A forced tool call wins over `response_format`
    (which shapes text answers; a forced call has none). With tools the model may call, the
    answer is either a call or text in the response format. Called off the event loop, since
    converting a large schema takes a while."""
    if forced:
        return GrammarSpec("gbnf", _tool_call_grammar(forced))
    if _format_kind(req) == "text":
        return None
    tools = [(f.name, f.parameters) for f in _functions(req)] if tool_calls_wanted(req) else []
    return json_answer_grammar(
        schema, tools, unusable=Detail.JSON_SCHEMA_UNUSABLE, field="response_format"
    )


def _tool_call_grammar(functions: list[FunctionDefinition]) -> str:
    return grammars.tool_call_grammar([(f.name, f.parameters) for f in functions])


def _system_prompt(message: ChatMessage) -> str | None:
    content = message.content
    if isinstance(content, list):
        return content[0].text if content else ""
    return content


def _check_role(position: int, role: Role) -> None:
    allowed = (Role.USER, Role.TOOL) if position % 2 == 0 else (Role.ASSISTANT, Role.FUNCTION)
    if role not in allowed:
        raise bad(Detail.INVALID_ROLE)


def _items(message: ChatMessage) -> list[MultimodalInputItem] | None:
    """The content items `_turn` checks (None: a string or null, or an assistant's calls)."""
    if message.role is Role.ASSISTANT and message.tool_calls:
        return None
    return message.content if isinstance(message.content, list) else None


async def _turn(
    message: ChatMessage, index: int, limits: Limits, late: list[str], lookups: bool
) -> PendingTurn:
    """One message as the template sees it, its media not read yet; errors the reference
    reports later go to `late`. `lookups`: whether media URLs' hosts may be looked up."""
    if message.role is Role.ASSISTANT and message.tool_calls:
        calls = [
            {"name": c.function.name, "arguments": c.function.arguments} for c in message.tool_calls
        ]
        return PendingTurn(Role.FUNCTION.value, json.dumps(calls, ensure_ascii=False))
    items = _items(message)
    if items is not None:
        text, sources = await flatten(items, index, limits, late, lookups)
        return PendingTurn(message.role.value, text, tuple(sources))
    content = message.content
    if content is None:
        late.append(Detail.CONTENT_NULL.format(index=index))
        content = ""
    return PendingTurn(message.role.value, content)


def _serialize_tools(tools: list[FunctionAvailable] | None) -> str | None:
    """Reference section 5.5: the functions as one JSON string; None when there are none."""
    if not tools:
        return None
    functions = []
    for index, tool in enumerate(tools):
        if tool.function is None:
            raise bad(Detail.TOOL_WITHOUT_FUNCTION.format(index=index))
        functions.append(tool.function.model_dump(exclude_unset=True))
    return json.dumps(functions, ensure_ascii=False)


def _chat_params(req: ChatCompletionRequest, limits: Limits) -> SamplingParams:
    """Check the sampling fields and map them; unset fields keep the engine's defaults.

    When both are given, max_completion_tokens (OpenAI's current name) wins over max_tokens.
    presence_penalty keeps its OpenAI meaning; repetition_penalty maps to repeat_penalty. As in
    the reference, n > 1 forces sampling, at temperature 1.0 when it is unset or 0. Ranges are
    OpenAI's where it has one; seed is any int64 (the engine reduces it to its own width), and
    top_k is clamped to int32 (any value past the vocabulary size means "no top-k").
    """
    token_field = "max_tokens" if req.max_completion_tokens is None else "max_completion_tokens"
    params = sampling_params(req, limits, token_field, getattr(req, token_field))
    check_range("top_logprobs", req.top_logprobs, low=0, high=MAX_TOP_LOGPROBS)
    if req.top_logprobs is not None and not req.logprobs:
        raise bad(Detail.TOP_LOGPROBS_WITHOUT_LOGPROBS)
    return replace(params, logprobs=(req.top_logprobs or 0) if req.logprobs else None)


async def would_reject(
    body: Any, *, stream_checks: bool = True, limits: Limits | None = None
) -> errors.ApiError | None:
    """The error a decoded chat body would get (schema and request checks), or None.

    With stream_checks=False the body is judged as if `stream` were false.
    """
    limits = limits or Limits()
    try:
        req = parse_chat_request(body, audio="audio" in limits.media_kinds)
        if not stream_checks:
            req = req.model_copy(update={"stream": False})
        await prepare_chat(req, limits)
    except errors.ApiError as exc:
        return exc
    return None
