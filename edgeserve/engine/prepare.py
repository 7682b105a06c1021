"""Making a request ready for the engine, on a prepare thread (never the engine thread).

Rendering a chat template and tokenizing are the costly parts of a request that does not fit
(100,000 messages, megabytes of score texts); here they run beside the engine, and a text whose
UTF-8 size alone proves that it cannot fit is refused before it is tokenized: no token is
longer than the vocabulary's longest piece, so B bytes are at least B / longest tokens.
"""

from __future__ import annotations

from edgeserve.engine.backend import Backend
from edgeserve.engine.jobs import Prompt
from edgeserve.engine.sampling import grammar_text
from edgeserve.engine.scoring import TextState
from edgeserve.engine.types import (
    ChatPrompt,
    EngineConfig,
    GenerationRequest,
    ScoreRequest,
)
from edgeserve.errors import PromptTooLong, RequestTooLarge


def at_least_tokens(backend: Backend, text: str) -> int:
    """A lower bound on the tokens of `text`, from its UTF-8 size alone (0 for a text shorter
    than the context in bytes, which the bound could never refuse)."""
    size = len(text.encode("utf-8", "surrogatepass"))
    return size // backend.max_piece_bytes if size >= backend.n_ctx else 0


def prepare_generation(
    backend: Backend, config: EngineConfig, request: GenerationRequest
) -> Prompt:
    """Render, bound, tokenize and size a generation; check its grammar. Raises
    PromptTooLong or InvalidPrompt."""
    n_ctx = backend.n_ctx
    if isinstance(request.prompt, ChatPrompt):
        chat, text = True, backend.render(request.prompt)
    else:
        chat, text = False, request.prompt
    bound = at_least_tokens(backend, text)
    if bound >= n_ctx:
        raise PromptTooLong(bound, n_ctx, at_least=True)
    tokens = backend.tokenize(text, add_special=not chat, parse_special=chat)
    if chat and backend.add_bos and (not tokens or tokens[0] != backend.bos):
        tokens.insert(0, backend.bos)
    n_prompt = len(tokens)
    if n_prompt >= n_ctx:
        raise PromptTooLong(n_prompt, n_ctx)
    gbnf = None
    if request.params.grammar is not None:
        gbnf = grammar_text(request.params.grammar)
        backend.check_grammar(gbnf)
    room = n_ctx - n_prompt
    wanted = request.params.max_tokens
    max_new = min(wanted, room) if wanted is not None else room
    share = max(1, n_ctx // config.parallel)
    reserve = min(n_ctx, n_prompt + request.n * min(max_new, share))
    return Prompt(tokens, max_new, reserve, gbnf)


def prepare_score(backend: Backend, config: EngineConfig, request: ScoreRequest) -> list[TextState]:
    """Tokenize each text (truncated to max_length), checking the limits as it goes. Raises
    PromptTooLong (naming the text) or RequestTooLarge."""
    n_ctx = backend.n_ctx
    texts: list[TextState] = []
    total = 0
    for index, text in enumerate(request.texts):
        if request.max_length is None and (bound := at_least_tokens(backend, text)) > n_ctx:
            raise PromptTooLong(bound, n_ctx, index=index, at_least=True)
        tokens = backend.tokenize(text, add_special=True, parse_special=False)
        if request.max_length is not None:
            tokens = tokens[: request.max_length]
        if len(tokens) > n_ctx:
            raise PromptTooLong(len(tokens), n_ctx, index=index)
        total += len(tokens)
        if total > config.max_score_tokens:
            raise RequestTooLarge("tokens", total, config.max_score_tokens)
        texts.append(TextState(tokens, classify=backend.is_classifier))
    return texts
