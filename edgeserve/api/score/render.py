"""POST /v1/score/evaluation's answer."""

from __future__ import annotations

import uuid

from edgeserve.api.score.wire import ScoreEvaluationResponse


def new_score_id() -> str:
    """`scoreval-` + 32 lowercase hex digits."""
    return f"scoreval-{uuid.uuid4().hex}"


def score_body(
    id: str, model: str, scores: list[float], token_logprobs: list[list[float]] | None
) -> bytes:
    """The score response (no `created`); NaN is written as null, `token_logprobs` only when
    it was requested."""
    response = ScoreEvaluationResponse(
        id=id, model=model, scores=scores, token_logprobs=token_logprobs
    )
    exclude = None if token_logprobs is not None else {"token_logprobs"}
    return response.model_dump_json(exclude=exclude).encode()
