"""POST /v1/responses: its own checks, and the translation to a chat request that prepare_chat
then checks."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from edgeserve.api.common.sampling import check_max_tokens
from edgeserve.api.common.wire import URL, MultimodalInputItem, Role
from edgeserve.api.openai_chat.translate import prepare_chat
from edgeserve.api.openai_chat.wire import (
    ChatCompletionRequest,
    ChatMessage,
    Function,
    FunctionAvailable,
    FunctionCall,
    FunctionDefinition,
    ResponseFormat,
)
from edgeserve.api.openai_responses.wire import (
    InputContent,
    InputItem,
    ResponsesRequest,
    ResponsesTool,
    TextConfig,
)
from edgeserve.api.reference.detail import Detail
from edgeserve.api.reference.limits import Limits, bad, check_unicode_values
from edgeserve.api.reference.request import parse_body
from edgeserve.engine.types import GenerationRequest

Content = str | list[MultimodalInputItem]
"""A chat message's content: one text, or items when it has images."""


# The request's fields the response object repeats (render.py `_response`).
_REPEATED = frozenset({"model", "instructions", "tools", "tool_choice", "text", "metadata"})


def parse_responses_request(body: Any) -> ResponsesRequest:
    """Validate a decoded body against the Responses schema; 422, FastAPI-shaped."""
    return parse_body(ResponsesRequest, body)


@dataclass(frozen=True)
class ResponsesWork:
    """A Responses request as chat sees it (`chat`, which also says whether the answer is read
    for tool calls) and the engine request built from it."""

    chat: ChatCompletionRequest
    generation: GenerationRequest


async def prepare_responses(req: ResponsesRequest, limits: Limits) -> ResponsesWork:
    """Responses' own checks, in field order (stateless fields, max_output_tokens, input items,
    tools, tool_choice, text.format), then every chat check on the translated request, then
    that the fields the response repeats can be encoded (no lone surrogate)."""
    for name, value in (
        ("previous_response_id", req.previous_response_id is not None),
        ("store", req.store),
        ("background", req.background),
    ):
        if value:
            raise bad(Detail.STATELESS.format(field=name))
    check_max_tokens("max_output_tokens", req.max_output_tokens, limits)
    chat = ChatCompletionRequest(
        model=req.model,
        messages=_chat_messages(req),
        tools=_chat_tools(req.tools),
        tool_choice=_chat_tool_choice(req.tool_choice),
        response_format=_chat_format(req.text),
        temperature=req.temperature,
        top_p=req.top_p,
        max_tokens=req.max_output_tokens,
        stream=req.stream,
        user=req.user,
    )
    generation = await prepare_chat(chat, limits)
    check_unicode_values(req.model_dump(mode="json", include=_REPEATED).items())
    return ResponsesWork(chat=chat, generation=generation)


def _chat_messages(req: ResponsesRequest) -> list[ChatMessage]:
    """`instructions`, then `input` as chat messages: leading system/developer messages join
    the instructions in one system message, consecutive user (or assistant) messages join in
    one, consecutive function_call items become one assistant message with tool_calls, and
    consecutive function_call_output items one tool message (texts blank-line separated, in
    input order: the outputs of parallel calls follow the calls' order)."""
    system = [] if req.instructions is None else [req.instructions]
    items = [InputItem(role="user", content=req.input)] if isinstance(req.input, str) else req.input
    messages: list[ChatMessage] = []
    for index, item in enumerate(items):
        if item.type == "message":
            if item.role in ("system", "developer"):
                if messages:
                    raise bad(Detail.SYSTEM_NOT_FIRST.format(index=index, role=item.role))
                system.append(_item_text(item, index))
            elif item.role in ("user", "assistant"):
                content = _item_content(item.content, index, item.type, "content")
                _add_content(messages, Role(item.role), content)
            else:
                role = json.dumps(item.role, ensure_ascii=False)
                raise bad(Detail.ROLE_UNSUPPORTED.format(index=index, role=role))
        elif item.type == "function_call":
            function = Function(
                name=_item_field(item.name, index, item.type, "name"),
                arguments=_item_field(item.arguments, index, item.type, "arguments"),
            )
            call = FunctionCall(
                id=_item_field(item.call_id, index, item.type, "call_id"), function=function
            )
            if messages and messages[-1].role is Role.ASSISTANT:
                messages[-1].tool_calls = [*(messages[-1].tool_calls or ()), call]
            else:
                messages.append(ChatMessage(role=Role.ASSISTANT, tool_calls=[call]))
        elif item.type == "function_call_output":
            _item_field(item.call_id, index, item.type, "call_id")
            output = _item_content(item.output, index, item.type, "output")
            _add_content(messages, Role.TOOL, output)
        else:
            raise bad(Detail.ITEM_UNSUPPORTED.format(index=index, type=item.type))
    if system:
        messages.insert(0, ChatMessage(role=Role.SYSTEM, content="\n\n".join(system)))
    return messages


def _add_content(messages: list[ChatMessage], role: Role, content: Content) -> None:
    """A new turn, or `content` joined to the last turn (after a blank line) when that has the
    same role and no calls."""
    last = messages[-1] if messages else None
    if last is None or last.role is not role or last.tool_calls:
        messages.append(ChatMessage(role=role, content=content))
    elif isinstance(last.content, str) and isinstance(content, str):
        last.content = f"{last.content}\n\n{content}"
    else:
        last.content = [*_items(last.content), _text_item("\n\n"), *_items(content)]


def _items(content: Content | None) -> list[MultimodalInputItem]:
    if isinstance(content, list):
        return content
    return [_text_item(content or "")]


def _text_item(text: str) -> MultimodalInputItem:
    return MultimodalInputItem(type="text", text=text)


def _item_field(value: str | None, index: int, kind: str, name: str) -> str:
    if value is None:
        raise bad(Detail.ITEM_MISSING_FIELD.format(index=index, type=kind, field=name))
    return value


def _item_text(item: InputItem, index: int) -> str:
    """A system or developer message's content as one text (see _item_content); 400 for an
    image in it."""
    for number, part in enumerate(item.content if isinstance(item.content, list) else ()):
        if part.type == "input_image":
            raise bad(Detail.SYSTEM_IMAGE.format(index=index, part=number, role=item.role))
    text = _item_content(item.content, index, item.type, "content")
    assert isinstance(text, str)
    return text


def _item_content(
    content: str | list[InputContent] | None, index: int, kind: str, name: str
) -> Content:
    """A message's content or a function output (field `name` of a `kind` item): one text, or
    chat's content items when it has images; 400 when it is absent or has parts other than
    text and images."""
    if content is None:
        raise bad(Detail.ITEM_MISSING_FIELD.format(index=index, type=kind, field=name))
    if isinstance(content, str):
        return content
    items = []
    for number, part in enumerate(content):
        if part.type == "input_image":
            items.append(_image_item(part, index, number))
            continue
        if part.type not in ("input_text", "output_text", "text"):
            raise bad(Detail.PART_UNSUPPORTED.format(index=index, part=number, type=part.type))
        if part.text is None:
            where = f"input[{index}].{name}[{number}]"
            raise bad(Detail.TEXT_WITHOUT_TEXT.format(where=where))
        items.append(_text_item(part.text))
    if all(item.type == "text" for item in items):
        return "".join(item.text or "" for item in items)
    return items


def _image_item(part: InputContent, index: int, number: int) -> MultimodalInputItem:
    """An `input_image` as chat's image_url item; 400 for a file_id or a URL that is neither
    a data URL nor http(s) (chat's media checks then apply)."""
    if part.image_url is None:
        detail = Detail.INPUT_IMAGE_FILE_ID if part.file_id else Detail.INPUT_IMAGE_URL
        raise bad(detail.format(index=index, part=number))
    if not part.image_url.lower().startswith(("data:", "http://", "https://")):
        raise bad(Detail.INPUT_IMAGE_URL.format(index=index, part=number))
    return MultimodalInputItem(type="image_url", image_url=URL(url=part.image_url))


def _chat_tools(tools: list[ResponsesTool] | None) -> list[FunctionAvailable] | None:
    """Function tools in chat's nested shape; a tool without parameters takes none."""
    if tools is None:
        return None
    result = []
    for index, tool in enumerate(tools):
        if tool.type != "function":
            raise bad(Detail.TOOL_UNSUPPORTED.format(index=index, type=tool.type))
        if not tool.name:
            raise bad(Detail.TOOL_WITHOUT_NAME.format(index=index))
        fields: dict[str, Any] = {"name": tool.name, "parameters": tool.parameters}
        if tool.parameters is None:
            fields["parameters"] = {"type": "object", "properties": {}}
        if tool.description is not None:
            fields["description"] = tool.description
        result.append(FunctionAvailable(function=FunctionDefinition(**fields)))
    return result


def _chat_tool_choice(choice: Any) -> Any:
    """Responses' `{"type": "function", "name": ...}` in chat's nested shape; the strings as
    they are."""
    if choice is None or choice in ("none", "auto", "required"):
        return choice
    if (
        isinstance(choice, dict)
        and choice.get("type") == "function"
        and isinstance(choice.get("name"), str)
    ):
        return {"type": "function", "function": {"name": choice["name"]}}
    value = json.dumps(choice, ensure_ascii=False)
    raise bad(Detail.RESPONSES_TOOL_CHOICE_INVALID.format(value=value))


def _chat_format(text: TextConfig | None) -> ResponseFormat | None:
    """`text.format` as chat's `response_format` (None for plain text)."""
    if text is None or text.format.type == "text":
        return None
    if text.format.type == "json_object":
        return ResponseFormat(type="json_object")
    if text.format.json_schema is None:
        raise bad(Detail.TEXT_FORMAT_WITHOUT_SCHEMA)
    schema = {"name": text.format.name, "schema": text.format.json_schema}
    return ResponseFormat(type="json_schema", json_schema=schema)
