"""POST /v1/score/evaluation: logit-based scores, one per text, in request order."""

from __future__ import annotations

from dataclasses import replace

from edgeserve.api.common.call import Call, Route
from edgeserve.api.score.render import new_score_id, score_body
from edgeserve.api.score.translate import parse_score_request, prepare_score


async def score_evaluation(call: Call) -> bytes:
    """Validate, score in the engine thread (batched with chat), answer as the reference."""
    req = await call.off_loop(parse_score_request, call.body)
    work = await call.off_loop(prepare_score, req, call.limits)
    work = replace(work, adapters=call.adapters())
    async with call.engine_work():  # a cancelled score() aborts the work
        result = await call.engine.score(work)
    call.record.prompt_tokens = result.n_tokens
    per_token = [list(t) for t in result.token_logprobs] if result.token_logprobs else None
    return score_body(new_score_id(), req.model, list(result.scores), per_token)


ROUTES = (Route("POST", "/v1/score/evaluation", score_evaluation),)
