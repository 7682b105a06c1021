"""Anthropic's POST /v1/messages and /v1/messages/count_tokens: the schemas, the conversation as
chat's engine turns, the Messages checks, and the status and error type Anthropic answers with."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import Any, Final

from edgeserve import errors, grammars
from edgeserve.api.anthropic_messages.wire import (
    CountTokensRequest,
    DocumentBlock,
    FileImageSource,
    ImageBlock,
    MessageParam,
    MessagesRequest,
    TextBlock,
    ToolResultBlock,
    ToolUseBlock,
    URLImageSource,
)
from edgeserve.api.common.media import (
    MediaSource,
    PendingTurn,
    check_media_count,
    check_remote_url,
    decode_base64,
    media_refusal,
    read_turns,
)
from edgeserve.api.common.sampling import INT32_MAX, check_max_tokens, check_range, stop_strings
from edgeserve.api.common.wire import Role
from edgeserve.api.reference.detail import Detail
from edgeserve.api.reference.limits import Limits, bad, check_unicode
from edgeserve.api.reference.request import parse_body
from edgeserve.engine.types import (
    MEDIA_MARKER,
    ChatPrompt,
    GenerationRequest,
    GrammarSpec,
    SamplingParams,
)


def parse_messages_request(body: Any) -> MessagesRequest:
    """Validate a decoded body against Anthropic's Messages schema (422 items; an Anthropic
    endpoint answers them as 400, see anthropic_error)."""
    return parse_body(MessagesRequest, body)


def parse_count_tokens_request(body: Any) -> CountTokensRequest:
    """Validate a decoded body against the count_tokens schema (as parse_messages_request)."""
    return parse_body(CountTokensRequest, body)


@dataclass(frozen=True)
class MessagesPrompt:
    """A Messages request's conversation as chat's turns (their images not read yet), and
    the tools a forced call may use (None when no call is forced)."""

    turns: tuple[PendingTurn, ...]
    system: str | None
    tools: str | None
    forced: list[tuple[str, dict[str, Any]]] | None

    async def read(self, limits: Limits) -> ChatPrompt:
        """The engine's prompt, its images read (see api/common/media.py)."""
        return ChatPrompt(await read_turns(self.turns, limits), self.system, self.tools)


@dataclass(frozen=True)
class _Piece:
    """Part of a turn's content: text, an image block (a MEDIA_MARKER, `image`), or a tool
    result's text and images."""

    text: str
    sources: tuple[MediaSource, ...] = ()
    image: bool = False


def _joined(pieces: list[_Piece], separator: str) -> _Piece:
    """The pieces in order, `separator` between two that are not images (an image stands
    right beside its text, as chat's items do), their images in the same order."""
    text = "".join(
        (separator if i and not (piece.image or pieces[i - 1].image) else "") + piece.text
        for i, piece in enumerate(pieces)
    )
    return _Piece(text, tuple(source for piece in pieces for source in piece.sources))


def messages_calls_wanted(req: CountTokensRequest) -> bool:
    """Whether a Messages answer is read for tool calls: the request has tools and its
    tool_choice is not "none" (the tools are still shown to the model then)."""
    return bool(req.tools) and (req.tool_choice is None or req.tool_choice.type != "none")


async def prepare_messages(req: MessagesRequest, limits: Limits) -> GenerationRequest:
    """Anthropic's Messages checks and the engine request, as chat builds it.

    Order: the conversation (see messages_prompt); max_tokens (required by the schema, at
    least 1, at most the server's cap); temperature 0–1, top_p 0–1, top_k ≥ 0 (Anthropic's
    ranges); invalid Unicode; the grammar of a forced call (tool_choice any or tool); last the
    images read (size limits, downloads; their count is checked with the conversation).
    """
    conversation = await messages_prompt(req, limits)
    check_max_tokens("max_tokens", req.max_tokens, limits)
    check_range("temperature", req.temperature, low=0.0, high=1.0)
    check_range("top_p", req.top_p, low=0.0, high=1.0)
    check_range("top_k", req.top_k, low=0)
    stop = stop_strings(req.stop_sequences)
    check_unicode(
        [
            ("model", req.model),
            *_prompt_texts(conversation),
            *(("stop_sequences", text) for text in stop),
        ]
    )
    grammar = None
    if conversation.forced:
        text = await asyncio.to_thread(grammars.tool_call_grammar, conversation.forced)
        grammar = GrammarSpec("gbnf", text)
    optional = {
        "temperature": req.temperature,
        "top_p": req.top_p,
        "top_k": None if req.top_k is None else min(req.top_k, INT32_MAX),
    }
    params = SamplingParams(
        max_tokens=req.max_tokens,
        stop=stop,
        grammar=grammar,
        **{name: value for name, value in optional.items() if value is not None},
    )
    return GenerationRequest(prompt=await conversation.read(limits), params=params)


async def prepare_count_tokens(req: CountTokensRequest, limits: Limits) -> ChatPrompt:
    """The prompt whose tokens count_tokens counts (images included: the engine counts their
    tokens), after the same checks as a Messages request's conversation and tools."""
    conversation = await messages_prompt(req, limits)
    check_unicode([("model", req.model), *_prompt_texts(conversation)])
    return await conversation.read(limits)


def _prompt_texts(conversation: MessagesPrompt) -> list[tuple[str, str | None]]:
    return [
        ("system", conversation.system),
        *((f"messages[{i}]", turn.content) for i, turn in enumerate(conversation.turns)),
        ("tools", conversation.tools),
    ]


async def messages_prompt(req: CountTokensRequest, limits: Limits) -> MessagesPrompt:
    """A Messages conversation as chat's engine turns, and its tool choice.

    Consecutive messages of one role are one turn (as Anthropic merges them); the first must
    be a user's and so must the last (no prefilled answers). A user message with tool_result
    blocks is a "tool" turn: the results' text (an error result prefixed "Error: ") then any
    other text, each result answering a tool_use of the assistant turn before it. An assistant
    message with tool_use blocks is a "function" turn (chat's shape: the calls, its text left
    out). Thinking blocks are left out; images (user messages and tool results) stand where
    they are, as chat's media items, counted (--max-media-per-request) before any is checked;
    document blocks answer 400.
    """
    if not req.messages:
        raise bad(Detail.MESSAGES_EMPTY)
    if req.messages[0].role != "user":
        raise bad(Detail.MESSAGES_FIRST_NOT_USER)
    if req.messages[-1].role != "user":
        raise bad(Detail.MESSAGES_PREFILL)
    check_media_count(_image_count(req.messages), limits)  # before any image URL's lookup
    groups: list[list[tuple[int, MessageParam]]] = []
    for index, message in enumerate(req.messages):
        if groups and groups[-1][0][1].role == message.role:
            groups[-1].append((index, message))
        else:
            groups.append([(index, message)])
    turns: list[PendingTurn] = []
    calls: set[str] = set()
    for group in groups:
        turn, calls = await _messages_turn(group, calls, limits)
        turns.append(turn)
    system = req.system
    if isinstance(system, list):
        system = "\n\n".join(block.text for block in system)
    tools = None
    if req.tools:
        tools = json.dumps(
            [
                {"name": tool.name, "parameters": tool.input_schema}
                | ({} if tool.description is None else {"description": tool.description})
                for tool in req.tools
            ],
            ensure_ascii=False,
        )
    kind = "auto" if req.tool_choice is None else req.tool_choice.type
    forced = _messages_forced(req, kind) if kind in ("any", "tool") else None
    return MessagesPrompt(tuple(turns), system or None, tools, forced)


def _image_count(messages: list[MessageParam]) -> int:
    """The image blocks of `messages`, those in tool results included."""
    blocks = [block for m in messages if not isinstance(m.content, str) for block in m.content]
    inner = [
        part
        for block in blocks
        if isinstance(block, ToolResultBlock) and not isinstance(block.content, str)
        for part in block.content
    ]
    return sum(isinstance(block, ImageBlock) for block in blocks + inner)


async def _messages_turn(
    group: list[tuple[int, MessageParam]], calls: set[str], limits: Limits
) -> tuple[PendingTurn, set[str]]:
    """One turn from consecutive messages of one role, and the ids of its tool_use blocks;
    `calls` are the ids the assistant turn before it made."""
    role = group[0][1].role
    texts: list[_Piece] = []
    results: list[_Piece] = []
    uses: list[dict[str, str]] = []
    made: set[str] = set()
    for index, message in group:
        if not message.content:
            raise bad(Detail.MESSAGE_EMPTY.format(index=index))
        blocks = (
            [TextBlock(text=message.content)]
            if isinstance(message.content, str)
            else message.content
        )
        for number, block in enumerate(blocks):
            where = {"index": index, "number": number, "kind": block.type, "role": role}
            if isinstance(block, TextBlock):
                texts.append(_Piece(block.text))
            elif isinstance(block, ImageBlock):
                if role == "assistant":
                    raise bad(Detail.IMAGE_IN_ASSISTANT.format(**where))
                place = f"messages[{index}].content[{number}]"
                texts.append(await _image(block, place, limits))
            elif isinstance(block, ToolUseBlock | ToolResultBlock):
                wrong = (role == "user") == isinstance(block, ToolUseBlock)
                if wrong:
                    raise bad(Detail.MESSAGE_BLOCK_WRONG_ROLE.format(**where))
                if isinstance(block, ToolUseBlock):
                    made.add(block.id)
                    arguments = json.dumps(block.input, ensure_ascii=False)
                    uses.append({"name": block.name, "arguments": arguments})
                    continue
                if block.tool_use_id not in calls:
                    tool_id = json.dumps(block.tool_use_id, ensure_ascii=False)
                    raise bad(Detail.TOOL_RESULT_UNKNOWN_ID.format(id=tool_id, **where))
                results.append(await _tool_result(block, where, limits))
            elif isinstance(block, DocumentBlock):
                raise bad(Detail.MESSAGE_BLOCK_UNSUPPORTED.format(**where))
    if uses:
        return PendingTurn(Role.FUNCTION.value, json.dumps(uses, ensure_ascii=False)), made
    if results:
        content = _joined(results + texts, "\n\n")
        return PendingTurn(Role.TOOL.value, content.text, content.sources), made
    content = _joined([piece for piece in texts if piece.text], "\n\n")
    if not content.text:
        raise bad(Detail.MESSAGE_EMPTY.format(index=group[0][0]))
    return PendingTurn(role, content.text, content.sources), made


async def _tool_result(block: ToolResultBlock, where: dict[str, Any], limits: Limits) -> _Piece:
    """A tool result's text and images (text and image blocks may make it up)."""
    pieces = []
    content = [TextBlock(text=block.content)] if isinstance(block.content, str) else block.content
    for number, part in enumerate(content):
        if isinstance(part, TextBlock):
            pieces.append(_Piece(part.text))
        elif isinstance(part, ImageBlock):
            place = "messages[{index}].content[{number}]".format(**where)
            pieces.append(await _image(part, f"{place}.content[{number}]", limits))
        else:
            raise bad(Detail.MESSAGE_BLOCK_UNSUPPORTED.format(**(where | {"kind": part.type})))
    joined = _joined(pieces, "\n")
    text = f"Error: {joined.text}" if block.is_error else joined.text
    return _Piece(text, joined.sources)


async def _image(block: ImageBlock, place: str, limits: Limits) -> _Piece:
    """The image block at `place` as a MEDIA_MARKER and its source: 400 when the model takes
    no images, for a file source, bad base64 data or a URL the address rules refuse
    (E9–E13)."""
    refusal = media_refusal("image", place, limits)
    if refusal is not None:
        raise bad(refusal)
    source = block.source
    if isinstance(source, FileImageSource):
        raise bad(Detail.IMAGE_FILE_SOURCE.format(where=place))
    if isinstance(source, URLImageSource):
        await check_remote_url(source.url, limits)
        return _Piece(MEDIA_MARKER, (MediaSource("image", place, url=source.url),), image=True)
    data = decode_base64(source.data)
    if data is None:
        raise bad(Detail.BAD_BASE64.format(where=f"{place}.source.data"))
    return _Piece(MEDIA_MARKER, (MediaSource("image", place, data=data),), image=True)


def _messages_forced(req: CountTokensRequest, kind: str) -> list[tuple[str, dict[str, Any]]]:
    """The tools a forced call may use: all for "any", the named one for "tool"."""
    if not req.tools:
        raise bad(Detail.MESSAGES_TOOL_CHOICE_WITHOUT_TOOLS.format(value=json.dumps(kind)))
    tools = [(tool.name, tool.input_schema) for tool in req.tools]
    if kind == "any":
        return tools
    name = req.tool_choice.name if req.tool_choice else None
    if name is None:
        raise bad(Detail.TOOL_CHOICE_NEEDS_NAME)
    chosen = [tool for tool in tools if tool[0] == name]
    if not chosen:
        known = ", ".join(json.dumps(tool[0], ensure_ascii=False) for tool in tools)
        raise bad(
            Detail.MESSAGES_TOOL_UNKNOWN.format(
                name=json.dumps(name, ensure_ascii=False), known=known
            )
        )
    return chosen[:1]


_ANTHROPIC_TYPES: Final = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
    504: "timeout_error",
}


def anthropic_error(err: errors.ApiError) -> tuple[int, str]:
    """The status and Anthropic error type an Anthropic endpoint answers `err` with: a schema
    error (422) is Anthropic's 400 invalid_request_error; other 4xx keep their status; any
    other status without a type of its own is api_error."""
    status = 400 if err.status == 422 else err.status
    fallback = "invalid_request_error" if 400 <= status < 500 else "api_error"
    return status, _ANTHROPIC_TYPES.get(status, fallback)
