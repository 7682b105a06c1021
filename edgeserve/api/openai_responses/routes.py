"""POST /v1/responses (OpenAI Responses API, stateless), streamed (SSE) and not: translated to
a chat request and generated on the one generation path; only the answer's shape differs."""

from __future__ import annotations

from typing import Any

from edgeserve.api.common.call import Call, Route
from edgeserve.api.common.generating_api import GenerationWork, TokenUsage
from edgeserve.api.openai_chat.translate import tool_calls_wanted
from edgeserve.api.openai_responses.render import ResponsesRenderer
from edgeserve.api.openai_responses.translate import parse_responses_request, prepare_responses
from edgeserve.api.openai_responses.wire import ResponsesRequest
from edgeserve.api.reference.engine_errors import engine_error
from edgeserve.api.reference.limits import Limits
from edgeserve.errors import ApiError, EngineError


class ResponsesApi:
    """The Responses API: its own checks, then chat's, one engine request."""

    def parse(self, body: Any, limits: Limits) -> ResponsesRequest:
        """The Responses schema (422 FastAPI-shaped)."""
        return parse_responses_request(body)

    async def translate(self, req: ResponsesRequest, limits: Limits) -> GenerationWork:
        """Responses' checks, the translation to chat and every chat check."""
        work = await prepare_responses(req, limits)
        return GenerationWork(
            (work.generation,), stream=bool(req.stream), tools=tool_calls_wanted(work.chat)
        )

    def admission_error(self, work: GenerationWork, exc: EngineError, position: int) -> ApiError:
        """The engine's refusal as the reference reports it."""
        return engine_error(exc)

    async def renderer(
        self, req: ResponsesRequest, work: GenerationWork, call: Call, usage: TokenUsage
    ) -> ResponsesRenderer:
        """The response object and its events."""
        return ResponsesRenderer(req)


ROUTES = (Route("POST", "/v1/responses", ResponsesApi()),)
