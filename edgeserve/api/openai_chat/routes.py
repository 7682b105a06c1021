"""POST /v1/chat/completions, streamed (SSE) and not, on the one generation path."""

from __future__ import annotations

from typing import Any

from edgeserve.api.common.call import Call, Route
from edgeserve.api.common.generating_api import GenerationWork, TokenUsage
from edgeserve.api.openai_chat.render import ChatRenderer
from edgeserve.api.openai_chat.translate import parse_chat_request, prepare_chat, tool_calls_wanted
from edgeserve.api.openai_chat.wire import ChatCompletionRequest
from edgeserve.api.reference.engine_errors import engine_error
from edgeserve.api.reference.limits import Limits
from edgeserve.errors import ApiError, EngineError


class ChatApi:
    """Chat completions: the reference's checks, one engine request, OpenAI's chunks."""

    def parse(self, body: Any, limits: Limits) -> ChatCompletionRequest:
        """The chat schema (422 FastAPI-shaped); items may be `input_audio` when the model
        takes audio."""
        return parse_chat_request(body, audio="audio" in limits.media_kinds)

    async def translate(self, req: ChatCompletionRequest, limits: Limits) -> GenerationWork:
        """Every chat check in the reference's order, then the engine request."""
        generation = await prepare_chat(req, limits)
        return GenerationWork(
            (generation,),
            n=req.n,
            stream=req.stream,
            tools=tool_calls_wanted(req),
            logprobs=bool(req.logprobs),
        )

    def admission_error(self, work: GenerationWork, exc: EngineError, position: int) -> ApiError:
        """The engine's refusal as the reference reports it."""
        return engine_error(exc)

    async def renderer(
        self, req: ChatCompletionRequest, work: GenerationWork, call: Call, usage: TokenUsage
    ) -> ChatRenderer:
        """OpenAI's chat shape, named after the requested model."""
        include_usage = bool(req.stream_options and req.stream_options.include_usage)
        return ChatRenderer(req.model, include_usage=include_usage, logprobs=work.logprobs)


ROUTES = (Route("POST", "/v1/chat/completions", ChatApi()),)
