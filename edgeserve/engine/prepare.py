"""Making a request ready for the engine, on a prepare thread (never the engine thread).

Rendering a chat template and tokenizing are the costly parts of a request that does not fit
(100,000 messages, megabytes of score texts); here they run beside the engine, and a text whose
UTF-8 size alone proves that it cannot fit is refused before it is tokenized: no token is
longer than the vocabulary's longest piece, so B bytes are at least B / longest tokens. Token
prompts are used as given, once every id is known to be in the vocabulary.
"""

from __future__ import annotations

import json
from dataclasses import replace

from edgeserve import grammars
from edgeserve.engine.audio import AudioClip, read_audio
from edgeserve.engine.images import DecodedImage, decode_image
from edgeserve.engine.jobs import MediaSpan, Prompt, media_ids, prompt_tail
from edgeserve.engine.ports import Backend, MediaEmbeddings
from edgeserve.engine.prompt_store import MIN_TOKENS
from edgeserve.engine.scoring import TextState
from edgeserve.engine.slots import common_prefix
from edgeserve.engine.types import (
    MEDIA_MARKER,
    ChatPrompt,
    EmbedRequest,
    EngineConfig,
    GenerationRequest,
    GrammarSpec,
    Media,
    ScoreRequest,
    TokenPrompt,
)
from edgeserve.errors import (
    InvalidMedia,
    InvalidPrompt,
    MediaTooLarge,
    PromptTooLong,
    RequestTooLarge,
    UnknownToken,
)


def grammar_text(spec: GrammarSpec) -> str:
    """The GBNF source for a grammar spec (JSON schemas are converted by llama-cpp-python)."""
    if spec.kind == "json_object":
        return grammars.ANY_JSON_OBJECT
    if spec.kind == "json_schema":
        try:
            return grammars.schema_grammar(json.loads(spec.text))
        except (ValueError, grammars.GrammarError) as exc:
            raise InvalidPrompt(f"The JSON schema cannot be turned into a grammar: {exc}") from exc
    return spec.text


def at_least_tokens(backend: Backend, text: str) -> int:
    """A lower bound on the tokens of `text`, from its UTF-8 size alone (0 for a text shorter
    than the context in bytes, which the bound could never refuse)."""
    size = len(text.encode("utf-8", "surrogatepass"))
    return size // backend.max_piece_bytes if size >= backend.n_ctx else 0


def known_tokens(n_vocab: int, ids: tuple[int, ...], index: int | None = None) -> list[int]:
    """`ids` as a list, once each is a token of the vocabulary; else UnknownToken naming the
    first that is not (in text `index` of a score request)."""
    for position, token in enumerate(ids):
        if not 0 <= token < n_vocab:
            raise UnknownToken(position, token, n_vocab, index)
    return list(ids)


def prepare_generation(
    backend: Backend, config: EngineConfig, request: GenerationRequest
) -> Prompt:
    """Render, bound, tokenize and size a generation, its media encoded; check its grammar.
    Raises PromptTooLong, UnknownToken, InvalidPrompt (InvalidMedia) or RequestTooLarge."""
    n_ctx = backend.n_ctx
    prompt = request.prompt
    media: tuple[MediaSpan, ...] = ()
    marks: tuple[int, ...] = ()
    if isinstance(prompt, ChatPrompt) and any(turn.media for turn in prompt.messages):
        tokens, media = _media_prompt(backend, config, prompt)
    elif isinstance(prompt, TokenPrompt):
        tokens = known_tokens(backend.n_vocab, prompt.ids)
    else:
        text = backend.render(prompt) if isinstance(prompt, ChatPrompt) else prompt
        tokens = _text_tokens(backend, text, chat=isinstance(prompt, ChatPrompt))
        if backend.checkpoint_budget:
            marks = _checkpoint_marks(backend, prompt, text, tokens)
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
    tail = prompt_tail(n_prompt, backend.row_multiple)
    marks = tuple(m for m in marks if m < n_prompt - tail)  # one is due there anyway
    return Prompt(tokens, max_new, reserve, gbnf, media, marks, tail)


def _text_tokens(backend: Backend, text: str, *, chat: bool) -> list[int]:
    """A rendered chat (special tokens parsed, BOS ensured) or raw text (BOS added as the
    model says) as tokens; PromptTooLong when its size alone proves it cannot fit."""
    bound = at_least_tokens(backend, text)
    if bound >= backend.n_ctx:
        raise PromptTooLong(bound, backend.n_ctx, at_least=True)
    if chat:
        return _chat_tokens(backend, text)
    return backend.tokenize(text, add_special=True, parse_special=False)


def _chat_tokens(backend: Backend, text: str) -> list[int]:
    """A rendered conversation's tokens: special tokens parsed, BOS ensured."""
    tokens = backend.tokenize(text, add_special=False, parse_special=True)
    if backend.add_bos and (not tokens or tokens[0] != backend.bos):
        tokens.insert(0, backend.bos)
    return tokens


def _checkpoint_marks(
    backend: Backend, prompt: ChatPrompt | str, text: str, tokens: list[int]
) -> tuple[int, ...]:
    """Where a sliding-window model's checkpoints go besides the window's multiples, in order:
    where a conversation's last message starts and where the last line of its text (or of a
    raw prompt) starts, each moved back to a multiple of the backend's `row_multiple` (so the
    chunk from there keeps to it). The same conversation with another last message, or the
    same document with another question on its last line, then goes on from there. A mark
    before fewer than MIN_TOKENS positions would give back less than the extra chunk costs:
    none there."""
    starts = {_last_line_start(backend, prompt, text, tokens)}
    if isinstance(prompt, ChatPrompt):
        starts.add(_last_turn_start(backend, prompt, tokens))
    marks = {start - start % backend.row_multiple for start in starts}
    return tuple(sorted(m for m in marks if m >= MIN_TOKENS))


def _last_turn_start(backend: Backend, prompt: ChatPrompt, tokens: list[int]) -> int:
    """Where the conversation's last message starts in its `tokens`: how far they agree with
    the conversation rendered without it (0 when that cannot be rendered)."""
    earlier = replace(prompt, messages=prompt.messages[:-1])
    try:
        return common_prefix(_chat_tokens(backend, backend.render(earlier)), tokens)
    except InvalidPrompt:
        return 0


def _last_line_start(
    backend: Backend, prompt: ChatPrompt | str, text: str, tokens: list[int]
) -> int:
    """Where the last line of the last message's text (of a raw prompt: its own last line)
    starts in `tokens`, which `text` was tokenized into: the rest of `text` from that line on,
    tokenized alone, must be the prompt's last tokens (0 when it has no earlier line, or its
    tokens there do not split at the line's start)."""
    if isinstance(prompt, ChatPrompt):
        content = prompt.messages[-1].content if prompt.messages else ""
    else:
        content = prompt
    _, newline, line = content.rstrip().rpartition("\n")
    at = text.rfind(line) if newline and line.strip() else -1
    if at <= 0:
        return 0
    chat = isinstance(prompt, ChatPrompt)
    tail = backend.tokenize(text[at:], add_special=False, parse_special=chat)
    start = len(tokens) - len(tail)
    return start if tail and tokens[start:] == tail else 0


def _media_prompt(
    backend: Backend, config: EngineConfig, prompt: ChatPrompt
) -> tuple[list[int], tuple[MediaSpan, ...]]:
    """A conversation with media: the rendered text around each item tokenized as a chat's,
    each item through the projector (the tokens that frame it, then stand-in ids for the
    positions its embeddings take)."""
    items = [media for turn in prompt.messages for media in turn.media]
    text = backend.render(prompt)
    pieces = text.split(MEDIA_MARKER)
    if len(pieces) != len(items) + 1:
        raise InvalidPrompt(
            "The chat template did not keep each media item once in place "
            f"({len(pieces) - 1} places for {len(items)} items)"
        )
    bound = at_least_tokens(backend, "".join(pieces))
    if bound >= backend.n_ctx:
        raise PromptTooLong(bound, backend.n_ctx, at_least=True)
    tokens: list[int] = []
    spans: list[MediaSpan] = []
    positions = 0
    for number, (piece, media) in enumerate(zip(pieces, [*items, None], strict=True)):
        tokens += backend.tokenize(piece, add_special=False, parse_special=True)
        if media is None:
            break
        for part in _encoded(backend, config, media, number, positions):
            if isinstance(part, list):
                tokens += part
                continue
            n = len(part.rows)
            if n > (room := backend.media_room(part.non_causal)):
                raise InvalidMedia(
                    f"media item {number} takes {n} positions, more than the {room} "
                    "one decode may hold (--batch-size)"
                )
            positions += n  # within --max-media-tokens: encode_media checked before encoding
            spans.append(MediaSpan(len(tokens), part.rows, part.non_causal))
            tokens += media_ids(part.digest, n)
    if backend.add_bos and (not tokens or tokens[0] != backend.bos):
        tokens.insert(0, backend.bos)
        spans = [replace(span, start=span.start + 1) for span in spans]
    if not tokens or tokens[-1] < 0:
        raise InvalidPrompt("The prompt must end with text after its last media item")
    return tokens, tuple(spans)


def _encoded(
    backend: Backend, config: EngineConfig, media: Media, number: int, positions: int
) -> list[list[int] | MediaEmbeddings]:
    """Media item `number` of a conversation, after media of `positions` positions, through
    the projector: InvalidMedia naming it when it cannot be read (an image's header or an
    audio file's, read in Python first) or the model does not take its kind; RequestTooLarge
    when it would take the request past --max-media-tokens (never encoded then)."""
    if media.kind not in backend.media_kinds:
        raise InvalidMedia(f"media item {number}: this model takes no {media.kind} input")
    try:
        item: DecodedImage | AudioClip
        if media.kind == "image":
            item = decode_image(media.data, config.max_media_pixels)
        else:
            item = read_audio(media.data)
        return backend.encode_media(item, config.max_media_tokens - positions)
    except InvalidMedia as exc:
        raise InvalidMedia(f"media item {number} ({media.kind}): {exc}") from None
    except MediaTooLarge as exc:
        total = positions + exc.positions
        raise RequestTooLarge("media tokens", total, config.max_media_tokens) from None


def prepare_score(backend: Backend, config: EngineConfig, request: ScoreRequest) -> list[TextState]:
    """Tokenize each text (truncated to max_length), checking the limits as it goes. Raises
    PromptTooLong or UnknownToken (naming the text) or RequestTooLarge."""
    n_ctx = backend.n_ctx
    texts: list[TextState] = []
    total = 0
    for index, text in enumerate(request.texts):
        if isinstance(text, TokenPrompt):
            tokens = known_tokens(backend.n_vocab, text.ids, index)
        else:
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
        own_first = isinstance(text, TokenPrompt) or not backend.add_bos
        texts.append(TextState(tokens, classify=backend.is_classifier, own_first=own_first))
    return texts


def prepare_embed(backend: Backend, config: EngineConfig, request: EmbedRequest) -> list[list[int]]:
    """Tokenize each text to embed in the embedding model's vocabulary (BOS, and SEP for a
    BERT-like model, as it says), each within its embeddings context and all within the score
    token limit. Raises PromptTooLong or UnknownToken (naming the text), RequestTooLarge, or
    InvalidPrompt for a text of no tokens."""
    embedder = backend.embedder
    size = embedder.embed_size
    texts: list[list[int]] = []
    total = 0
    for index, text in enumerate(request.texts):
        if isinstance(text, TokenPrompt):
            tokens = known_tokens(embedder.n_vocab, text.ids, index)
        else:
            tokens = embedder.tokenize(text, add_special=True, parse_special=False)
        if not tokens:
            raise InvalidPrompt(f"input {index} has no tokens to embed")
        if len(tokens) > size:
            raise PromptTooLong(len(tokens), size, index=index)
        total += len(tokens)
        if total > config.max_score_tokens:
            raise RequestTooLarge("tokens", total, config.max_score_tokens)
        texts.append(tokens)
    return texts
