"""POST /v1/completions (OpenAI's legacy text completions), streamed (SSE) and not.

Each prompt is one engine request (raw text with BOS and no chat template, or token ids as
given), all submitted together so they share decode steps; choice `i * n + j` is answer j to
prompt i, OpenAI's order. With `echo` and `logprobs` (or `max_tokens: 0`) the prompts are also
scored, and their tokens lead each choice's log-probabilities, one entry per prompt token: a
text's first token has its value (it is predicted from BOS), the first of a token prompt has
none (nothing predicts it). A token prompt echoes as its tokens' text.
"""

from __future__ import annotations

from typing import Any

from edgeserve.api.common.call import Call, Route
from edgeserve.api.common.generating_api import TokenUsage
from edgeserve.api.common.logprobs import AlignedLogprob, prompt_entries
from edgeserve.api.openai_completions.render import CompletionsRenderer
from edgeserve.api.openai_completions.translate import (
    CompletionWork,
    completion_engine_error,
    parse_completion_request,
    prepare_completion,
)
from edgeserve.api.openai_completions.wire import CompletionRequest
from edgeserve.api.reference.limits import Limits
from edgeserve.errors import ApiError, EngineError


class CompletionsApi:
    """Legacy completions: one engine request per prompt, echoed and scored prompts."""

    def parse(self, body: Any, limits: Limits) -> CompletionRequest:
        """The completions schema (422 FastAPI-shaped)."""
        return parse_completion_request(body)

    async def translate(self, req: CompletionRequest, limits: Limits) -> CompletionWork:
        """The legacy completion checks, then the engine requests."""
        return prepare_completion(req, limits)

    def admission_error(self, work: CompletionWork, exc: EngineError, position: int) -> ApiError:
        """The refused prompt named as the request named it."""
        return completion_engine_error(exc, work.names, position)

    async def renderer(
        self, req: CompletionRequest, work: CompletionWork, call: Call, usage: TokenUsage
    ) -> CompletionsRenderer:
        """With `echo`, the prompts' texts (and, when scored, their token entries) lead the
        choices; without generations the scored prompts give the prompt token count."""
        leads = await _leads(call, work)
        echoed: list[list[AlignedLogprob]] | None = None
        if work.scoring is not None:
            try:
                result = await call.engine.score(work.scoring)
            except EngineError as exc:
                raise completion_engine_error(exc, work.names) from exc
            assert result.tokens is not None
            echoed = [prompt_entries(tokens) for tokens in result.tokens]
            if not work.requests:
                usage.prompt_tokens = result.n_tokens
        include_usage = bool(req.stream_options and req.stream_options.include_usage)
        return CompletionsRenderer(
            call.model_name if req.model is None else req.model,
            leads,
            req.n,
            echo=work.echo,
            generates=bool(work.requests),
            include_usage=include_usage,
            logprobs=work.logprobs,
            echoed=echoed,
        )


async def _leads(call: Call, work: CompletionWork) -> list[str]:
    """The text each prompt's choices start with: with `echo` the prompt (token ids as their
    text, special tokens as none, as its echoed tokens show them), else nothing."""
    leads = []
    for position, prompt in enumerate(work.prompts):
        if not work.echo:
            leads.append("")
        elif isinstance(prompt, str):
            leads.append(prompt)
        else:
            try:
                leads.append(await call.engine.detokenize(prompt.ids, special=False))
            except EngineError as exc:
                raise completion_engine_error(exc, work.names, position) from exc
    return leads


ROUTES = (Route("POST", "/v1/completions", CompletionsApi()),)
