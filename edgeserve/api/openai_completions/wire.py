"""Legacy text completion wire types (OpenAI `POST /v1/completions`).

The reference has no such endpoint, so the fields follow OpenAI's order and defaults
(`max_tokens` 16), followed by the sampling extensions edgeserve also accepts on chat.
"""

from __future__ import annotations

import time
from typing import Literal

from pydantic import Field

from edgeserve.api.common.wire import Finish, ProtocolModel, StreamOptions, Usage


class CompletionRequest(ProtocolModel):
    """POST /v1/completions body; `prompt` is one text, a list of texts, one list of token ids
    or a list of them (each prompt gets its own choices). `model` is optional (the served
    model), as in vLLM and llama-server."""

    model: str | None = None
    prompt: str | list[str] | list[int] | list[list[int]]
    best_of: int | None = None
    echo: bool = False
    frequency_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
    logprobs: int | None = None
    max_tokens: int | None = 16
    n: int = 1
    presence_penalty: float | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    suffix: str | None = None
    temperature: float | None = None
    top_p: float | None = None
    user: str | None = None
    do_sample: bool | None = None
    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None


class CompletionLogprobs(ProtocolModel):
    """OpenAI's legacy per-token log-probabilities, one list entry per token: its text, its
    log-probability, the most likely alternatives (text → log-probability) and where it
    starts in the choice's text (in characters). An echoed prompt's first token has null
    log-probability and alternatives when nothing predicts it."""

    tokens: list[str]
    token_logprobs: list[float | None]
    top_logprobs: list[dict[str, float] | None]
    text_offset: list[int]


class CompletionChoice(ProtocolModel):
    """One choice; `logprobs` is null unless requested; `finish_reason` is null only in
    stream chunks before the choice ends."""

    text: str
    index: int
    logprobs: CompletionLogprobs | None = None
    finish_reason: Finish | None = None


class CompletionResponse(ProtocolModel):
    """The non-stream body, and (with `usage` left out unless set) each stream chunk."""

    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None
