"""Ollama's /api/chat and /api/generate bodies as engine requests: the conversation (its
images routed to the media path), the options, `format` as the answer's grammar, tools; and
an empty conversation, which only loads or unloads the model."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, replace
from typing import Any

from edgeserve.api.common.media import (
    MediaSource,
    PendingTurn,
    check_media_count,
    decode_base64,
    media_refusal,
    read_turns,
)
from edgeserve.api.common.output_grammar import json_answer_grammar
from edgeserve.api.common.wire import Role
from edgeserve.api.ollama.options import read_options
from edgeserve.api.ollama.wire import ChatRequest, GenerateRequest, GenerationRequest, Message
from edgeserve.api.reference.detail import Detail
from edgeserve.api.reference.limits import Limits, bad, check_unicode
from edgeserve.engine.types import MEDIA_MARKER, ChatPrompt, GrammarSpec, SamplingParams
from edgeserve.engine.types import GenerationRequest as EngineRequest


@dataclass(frozen=True)
class OllamaWork:
    """A checked request: its engine request (None when it only loads or unloads the model),
    and whether its answer is read for tool calls."""

    request: EngineRequest | None
    tools: bool


async def prepare_chat(req: ChatRequest, limits: Limits) -> OllamaWork:
    """Every /api/chat check, then the engine request. System messages make the system prompt
    (joined in order); an assistant's `tool_calls` are its turn's calls; each message's images
    stand before its text."""
    options = _common_checks(req, limits)
    if not req.messages:
        return OllamaWork(None, False)
    check_media_count(sum(len(m.images or ()) for m in req.messages), limits)
    system = [m.content or "" for m in req.messages if m.role == "system"]
    placed = [(i, _turn(m, i, limits)) for i, m in enumerate(req.messages) if m.role != "system"]
    if not placed:
        raise bad(Detail.OLLAMA_NO_TURNS)
    turns = [turn for _, turn in placed]
    tools = _tools_json(req)
    texts = [(f"messages[{i}]", turn.content) for i, turn in placed]
    check_unicode([("model", req.model), ("system", "\n\n".join(system)), ("tools", tools), *texts])
    functions = [(t.function.name, t.function.parameters) for t in req.tools or ()]
    grammar = await _grammar(req, functions)
    prompt = ChatPrompt(await read_turns(turns, limits), "\n\n".join(system) or None, tools)
    params = replace(options, grammar=grammar)
    return OllamaWork(EngineRequest(prompt=prompt, params=params), bool(functions))


async def prepare_generate(req: GenerateRequest, limits: Limits) -> OllamaWork:
    """Every /api/generate check, then the engine request: the prompt (and `system`) as one
    user turn through the chat template, or with `raw` the prompt text as it is. `suffix`,
    `template` and `context` are refused: this server has no fill-in-the-middle, no Go
    templates and no token context to continue (send the conversation to /api/chat)."""
    options = _common_checks(req, limits)
    if req.suffix:
        raise bad(Detail.OLLAMA_SUFFIX_UNSUPPORTED)
    if req.template:
        raise bad(Detail.OLLAMA_TEMPLATE_UNSUPPORTED)
    if req.context:
        raise bad(Detail.OLLAMA_CONTEXT_UNSUPPORTED)
    images = req.images or []
    if not req.prompt and not images:
        return OllamaWork(None, False)
    if req.raw and (images or req.system):
        raise bad(Detail.OLLAMA_RAW_WITH_EXTRAS)
    check_unicode([("model", req.model), ("prompt", req.prompt), ("system", req.system)])
    grammar = await _grammar(req, [])
    params = replace(options, grammar=grammar)
    if req.raw:
        request = EngineRequest(prompt=req.prompt or "", params=params)
        return OllamaWork(request, False)
    check_media_count(len(images), limits)
    sources = tuple(_image(data, f"images[{i}]", limits) for i, data in enumerate(images))
    turn = PendingTurn(Role.USER.value, MEDIA_MARKER * len(sources) + (req.prompt or ""), sources)
    prompt = ChatPrompt(await read_turns([turn], limits), req.system or None)
    return OllamaWork(EngineRequest(prompt=prompt, params=params), False)


def _common_checks(req: GenerationRequest, limits: Limits) -> SamplingParams:
    """`think` (refused when asked for: no model here thinks apart from its answer), the
    options, then `format` (checked in `_grammar`)."""
    if req.think not in (None, False, "", "false"):
        raise bad(Detail.OLLAMA_NO_THINKING.format(model=json.dumps(req.model)))
    return read_options(req.options, limits)


async def _grammar(req: GenerationRequest, functions: list[tuple[str, Any]]) -> GrammarSpec | None:
    """`format`'s grammar: "json" any JSON object, an object that JSON schema's documents
    (with tools, a call or that); none for "" or none given."""
    fmt = req.format
    if fmt is None or fmt == "":
        return None
    if isinstance(fmt, str) and fmt != "json":
        raise bad(Detail.OLLAMA_FORMAT_INVALID.format(value=json.dumps(fmt)))
    schema = fmt if isinstance(fmt, dict) else None
    return await asyncio.to_thread(
        json_answer_grammar,
        schema,
        functions,
        unusable=Detail.OLLAMA_FORMAT_UNUSABLE,
        field="format",
    )


def _turn(message: Message, index: int, limits: Limits) -> PendingTurn:
    """One message as the chat template sees it (an assistant's calls as a "function" turn,
    a tool's result as a "tool" turn)."""
    if message.role == "assistant" and message.tool_calls:
        calls = [
            {
                "name": c.function.name,
                "arguments": json.dumps(c.function.arguments, ensure_ascii=False),
            }
            for c in message.tool_calls
        ]
        return PendingTurn(Role.FUNCTION.value, json.dumps(calls, ensure_ascii=False))
    images = message.images or []
    if images and message.role != "user":
        raise bad(Detail.OLLAMA_IMAGES_NOT_USER.format(index=index, role=message.role))
    where = f"messages[{index}].images"
    sources = tuple(_image(data, f"{where}[{i}]", limits) for i, data in enumerate(images))
    content = MEDIA_MARKER * len(sources) + (message.content or "")
    return PendingTurn(message.role, content, sources)


def _image(data: str, where: str, limits: Limits) -> MediaSource:
    """A base64 image at `where`: 400 when the model takes no images or the data is not
    base64."""
    refusal = media_refusal("image", where, limits)
    if refusal is not None:
        raise bad(refusal)
    decoded = decode_base64(data)
    if decoded is None:
        raise bad(Detail.BAD_BASE64.format(where=where))
    return MediaSource("image", where, data=decoded)


def _tools_json(req: ChatRequest) -> str | None:
    """The tools as the chat template (or edgeserve's tool note) gets them."""
    if not req.tools:
        return None
    return json.dumps(
        [tool.function.model_dump(exclude_none=True) for tool in req.tools], ensure_ascii=False
    )
