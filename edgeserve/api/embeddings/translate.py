"""POST /v1/embeddings: the schema, the embeddings checks, and its engine errors naming the
input at fault."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from edgeserve import errors
from edgeserve.api.embeddings.wire import EmbeddingRequest
from edgeserve.api.reference.detail import Detail
from edgeserve.api.reference.engine_errors import engine_error, token_engine_error
from edgeserve.api.reference.limits import Limits, bad, check_unicode, prompt_list
from edgeserve.api.reference.request import parse_body
from edgeserve.engine.types import EmbedRequest, TokenPrompt


def parse_embedding_request(body: Any) -> EmbeddingRequest:
    """Validate a decoded body against the embeddings schema; 422, FastAPI-shaped."""
    return parse_body(EmbeddingRequest, body)


def prepare_embeddings(
    req: EmbeddingRequest, limits: Limits, size: int
) -> tuple[EmbedRequest, tuple[str, ...]]:
    """The embeddings checks, in order: an empty input list or token list, too many inputs,
    `dimensions` other than the model's `size` (its vectors cannot be cut: only models
    trained with Matryoshka losses can, and a GGUF does not say whether it was), invalid
    Unicode. Returns the engine request and how messages name each input ("input" or
    "input[i]")."""
    prompts, single = prompt_list(req.input)
    if not prompts:
        raise bad(Detail.EMPTY_INPUT_LIST)
    names = ("input",) if single else tuple(f"input[{i}]" for i in range(len(prompts)))
    for where, prompt in zip(names, prompts, strict=True):
        if isinstance(prompt, TokenPrompt) and not prompt.ids:
            raise bad(Detail.EMPTY_TOKEN_INPUT.format(where=where))
    if len(prompts) > limits.max_embed_inputs:
        raise bad(Detail.TOO_MANY_INPUTS.format(count=len(prompts), limit=limits.max_embed_inputs))
    if req.dimensions is not None and req.dimensions != size:
        raise bad(Detail.DIMENSIONS_UNSUPPORTED.format(value=req.dimensions, size=size))
    texts = [(where, p) for where, p in zip(names, prompts, strict=True) if isinstance(p, str)]
    check_unicode([("model", req.model), *texts])
    return EmbedRequest(prompts), names


def embeddings_engine_error(exc: errors.EngineError, names: Sequence[str]) -> errors.ApiError:
    """engine_error for an embeddings request: an input too long for the embeddings context,
    or holding an unknown token id, is named as the request named it."""
    if isinstance(exc, errors.UnknownToken) and exc.index is not None:
        return token_engine_error(exc, names[exc.index])
    if isinstance(exc, errors.PromptTooLong) and exc.index is not None:
        return bad(
            Detail.EMBED_INPUT_TOO_LONG.format(
                where=names[exc.index], n_prompt=exc.count, n_ctx=exc.n_ctx
            )
        )
    return engine_error(exc)
