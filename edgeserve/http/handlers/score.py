"""POST /v1/score/evaluation: logit-based scores, one per text, in request order."""

from __future__ import annotations

import asyncio

from aiohttp import web

from edgeserve import responses, validation
from edgeserve.http.handlers.common import authenticated_body, engine_errors, off_loop
from edgeserve.http.keys import ENGINE, LIMITS, RECORD, SETTINGS


async def score_evaluation(request: web.Request) -> web.Response:
    """Validate, score in the engine thread (batched with chat), answer as the reference."""
    body, large = await authenticated_body(request)
    req = await off_loop(large, validation.parse_score_request, body)
    work = await off_loop(large, validation.prepare_score, req, request.app[LIMITS])
    seconds = request.app[SETTINGS].request_timeout_s
    limit = asyncio.timeout(seconds)
    async with engine_errors(limit, seconds), limit:  # a cancelled score() aborts the work
        result = await request.app[ENGINE].score(work)
    request[RECORD].prompt_tokens = result.n_tokens
    per_token = [list(t) for t in result.token_logprobs] if result.token_logprobs else None
    text = responses.score_body(responses.new_score_id(), req.model, list(result.scores), per_token)
    return web.Response(body=text, content_type="application/json")
