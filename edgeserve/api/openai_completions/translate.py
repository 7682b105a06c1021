"""POST /v1/completions: the legacy completion checks, the engine work of a valid request, and
its engine errors naming the prompt at fault."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from edgeserve import errors
from edgeserve.api.common.generating_api import GenerationWork
from edgeserve.api.common.sampling import MAX_TOP_LOGPROBS, check_range, sampling_params
from edgeserve.api.openai_completions.wire import CompletionRequest
from edgeserve.api.reference.detail import Detail
from edgeserve.api.reference.engine_errors import engine_error, token_engine_error
from edgeserve.api.reference.limits import Limits, bad, check_unicode, prompt_list
from edgeserve.api.reference.request import parse_body
from edgeserve.engine.types import GenerationRequest, ScoreRequest, TokenPrompt


def parse_completion_request(body: Any) -> CompletionRequest:
    """Validate a decoded body against the legacy completion schema; 422, FastAPI-shaped."""
    return parse_body(CompletionRequest, body)


@dataclass(frozen=True, kw_only=True)
class CompletionWork(GenerationWork):
    """What a completion request asks of the engine.

    `prompts` in request order (raw texts, or token ids used as given), `names` how messages
    name each ("prompt", or "prompt[i]" for a list); `requests` one engine request per
    prompt (none for `echo` with `max_tokens: 0`); `scoring` the prompts to score when their
    tokens are echoed with log-probabilities (or nothing is generated), else None.
    """

    prompts: tuple[str | TokenPrompt, ...]
    names: tuple[str, ...]
    scoring: ScoreRequest | None
    echo: bool = False


def prepare_completion(req: CompletionRequest, limits: Limits) -> CompletionWork:
    """The legacy completion checks, and the engine work of a valid request.

    Order: an empty prompt list or token list; the OpenAI features not implemented
    (`suffix`, `best_of` other than n); the sampling checks chat has (n, max_tokens — whose
    default is OpenAI's 16, null meaning as many as fit, 0 allowed only with `echo` —,
    ranges, logit_bias, stop); `logprobs` (0 to MAX_TOP_LOGPROBS); the number of choices
    (prompts × n) against the n limit; invalid Unicode. A text prompt is raw text, tokenized
    with the model's BOS and no chat template; token ids are checked against the vocabulary
    by the engine (see completion_engine_error).
    """
    prompts, single = prompt_list(req.prompt)
    if not prompts:
        raise bad(Detail.EMPTY_PROMPT_LIST)
    names = tuple(_prompt_names(len(prompts), single))
    for where, prompt in zip(names, prompts, strict=True):
        if isinstance(prompt, TokenPrompt) and not prompt.ids:
            raise bad(Detail.EMPTY_TOKEN_PROMPT.format(where=where))
    if req.suffix:
        raise bad(Detail.SUFFIX_UNSUPPORTED)
    if req.best_of is not None and req.best_of != req.n:
        raise bad(Detail.BEST_OF_UNSUPPORTED.format(n=req.n, value=req.best_of))
    echo_only = req.echo and req.max_tokens == 0
    params = sampling_params(req, limits, "max_tokens", None if echo_only else req.max_tokens)
    check_range("logprobs", req.logprobs, low=0, high=MAX_TOP_LOGPROBS)
    params = replace(params, logprobs=req.logprobs)
    total = len(prompts) * req.n
    if total > limits.max_n:
        raise bad(
            Detail.TOO_MANY_CHOICES.format(
                prompts=len(prompts), n=req.n, total=total, limit=limits.max_n
            )
        )
    texts = [(where, p) for where, p in zip(names, prompts, strict=True) if isinstance(p, str)]
    check_unicode([("model", req.model), *texts, *(("stop", text) for text in params.stop)])
    scoring = None
    if req.echo and (req.logprobs is not None or echo_only):
        scoring = ScoreRequest(texts=prompts, top_logprobs=req.logprobs or 0)
    generations = (
        ()
        if echo_only
        else tuple(GenerationRequest(prompt=prompt, params=params, n=req.n) for prompt in prompts)
    )
    return CompletionWork(
        generations,
        n=req.n,
        stream=req.stream,
        logprobs=req.logprobs is not None,
        prompts=prompts,
        names=names,
        scoring=scoring,
        echo=req.echo,
    )


def _prompt_names(count: int, single: bool) -> list[str]:
    """How messages name each prompt: "prompt", or "prompt[i]" for a list."""
    return ["prompt"] if single else [f"prompt[{i}]" for i in range(count)]


def completion_engine_error(
    exc: errors.EngineError, names: Sequence[str], index: int | None = None
) -> errors.ApiError:
    """engine_error for a completion request whose prompts `names` names: a prompt that does
    not fit the context, or holds an unknown token id, is named as the request named it. The
    failed engine request was for prompt `index`, or (None: the echo's scoring of every
    prompt) for the one the error says."""
    if isinstance(exc, errors.PromptTooLong | errors.UnknownToken):
        position = index if exc.index is None else exc.index
        assert position is not None, "an engine error of every prompt names its prompt"
        where = names[position]
        if isinstance(exc, errors.UnknownToken):
            return token_engine_error(exc, where)
        return bad(
            Detail.COMPLETION_PROMPT_TOO_LONG.format(
                where=f'"{where}"', n_prompt=exc.count, n_ctx=exc.n_ctx
            )
        )
    return engine_error(exc)
