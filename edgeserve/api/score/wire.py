"""Score evaluation wire types: the reference fields, then the extensions."""

from __future__ import annotations

from typing import Literal

from edgeserve.api.common.wire import ProtocolModel


class ScoreEvaluationRequest(ProtocolModel):
    """POST /v1/score/evaluation body; each message is a full pre-formatted text."""

    model: str
    messages: list[str]
    max_length: int | None = None
    reduction: Literal["mean", "sum"] = "mean"
    return_token_logprobs: bool = False


class ScoreEvaluationResponse(ProtocolModel):
    """Score response; `token_logprobs` is serialised only when it was requested."""

    id: str
    object: Literal["score.evaluation"] = "score.evaluation"
    model: str
    scores: list[float]
    token_logprobs: list[list[float]] | None = None
