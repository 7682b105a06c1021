"""Anthropic's POST /v1/messages (streamed and not) and POST /v1/messages/count_tokens: chat's
engine requests (the same ChatPrompt and sampling, tool calls read as chat reads them), on the
one generation path; errors leave in Anthropic's shape (the HTTP layer mounts these routes as a
sub-application with its own error middleware, see `anthropic_error_body`)."""

from __future__ import annotations

from typing import Any

from edgeserve.api.anthropic_messages.render import (
    MessagesRenderer,
    count_tokens_body,
    error_body,
)
from edgeserve.api.anthropic_messages.translate import (
    anthropic_error,
    messages_calls_wanted,
    parse_count_tokens_request,
    parse_messages_request,
    prepare_count_tokens,
    prepare_messages,
)
from edgeserve.api.anthropic_messages.wire import MessagesRequest
from edgeserve.api.common.call import Call, Route
from edgeserve.api.common.generating_api import GenerationWork, TokenUsage
from edgeserve.api.reference.engine_errors import engine_error
from edgeserve.api.reference.errors import error_message
from edgeserve.api.reference.limits import Limits
from edgeserve.errors import ApiError, EngineError


class MessagesApi:
    """Anthropic Messages: its checks, one engine request, Anthropic's events."""

    def parse(self, body: Any, limits: Limits) -> MessagesRequest:
        """The Messages schema (422 FastAPI-shaped)."""
        return parse_messages_request(body)

    async def translate(self, req: MessagesRequest, limits: Limits) -> GenerationWork:
        """Every Messages check, then the engine request."""
        generation = await prepare_messages(req, limits)
        return GenerationWork(
            (generation,), stream=bool(req.stream), tools=messages_calls_wanted(req)
        )

    def admission_error(self, work: GenerationWork, exc: EngineError, position: int) -> ApiError:
        """The engine's refusal as the reference reports it (Anthropic's shape on the way
        out)."""
        return engine_error(exc)

    async def renderer(
        self, req: MessagesRequest, work: GenerationWork, call: Call, usage: TokenUsage
    ) -> MessagesRenderer:
        """The message and its events, with the prompt's token count in message_start."""
        return MessagesRenderer(req.model, usage.prompt_tokens)


async def count_tokens(call: Call) -> bytes:
    """The prompt's tokens, counted as /v1/messages would send them to the model."""
    req = await call.off_loop(parse_count_tokens_request, call.body)
    prompt = await call.checks(prepare_count_tokens(req, call.limits))
    async with call.engine_work():
        count = await call.engine.count_prompt_tokens(prompt)
    return count_tokens_body(count)


def anthropic_error_body(err: ApiError) -> tuple[int, bytes]:
    """Any client error as an Anthropic endpoint answers it: the status and error type
    `anthropic_error` decides, and the same message edgeserve's own shape carries."""
    status, kind = anthropic_error(err)
    return status, error_body(kind, error_message(err.detail))


ROUTES = (
    Route("POST", "/v1/messages", MessagesApi()),
    Route("POST", "/v1/messages/count_tokens", count_tokens),
)
