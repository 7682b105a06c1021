"""POST /v1/score/evaluation: the schema and the score checks."""

from __future__ import annotations

from typing import Any

from edgeserve.api.reference.detail import Detail
from edgeserve.api.reference.limits import Limits, bad, check_unicode
from edgeserve.api.reference.request import parse_body
from edgeserve.api.score.wire import ScoreEvaluationRequest
from edgeserve.engine.types import ScoreRequest


def parse_score_request(body: Any) -> ScoreEvaluationRequest:
    """Validate a decoded body against the score schema; 422 with every error, FastAPI-shaped."""
    return parse_body(ScoreEvaluationRequest, body)


def prepare_score(req: ScoreEvaluationRequest, limits: Limits) -> ScoreRequest:
    """The score endpoint's checks: "Invalid request" for no texts, then max_length and limits."""
    if not req.messages:
        raise bad(Detail.INVALID_REQUEST)
    if req.max_length is not None and req.max_length < 1:
        raise bad(Detail.NOT_POSITIVE.format(name="max_length", value=req.max_length))
    if len(req.messages) > limits.max_score_texts:
        raise bad(
            Detail.TOO_MANY_TEXTS.format(count=len(req.messages), limit=limits.max_score_texts)
        )
    check_unicode(
        [("model", req.model), *((f"messages[{i}]", text) for i, text in enumerate(req.messages))]
    )
    return ScoreRequest(
        texts=tuple(req.messages),
        max_length=req.max_length,
        reduction=req.reduction,
        return_token_logprobs=req.return_token_logprobs,
    )
