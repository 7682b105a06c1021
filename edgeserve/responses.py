"""Pure builders from engine results to wire bytes.

Two JSON dialects, both the reference's: response bodies are compact pydantic-core JSON (raw
UTF-8, every field present, nulls included, declaration order), SSE chunks are Python
`json.dumps` with its default `", "`/`": "` separators and only the fields that were set.
Divergence 4: stream chunks also carry `object` and `created`, and the final chunk's
finish_reason is the true one.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import time
import uuid
from collections.abc import Sequence
from datetime import datetime
from typing import Any, Final, Literal

import numpy as np

from edgeserve.engine.types import TokenizerInfo
from edgeserve.logprobs import AlignedLogprob
from edgeserve.protocol import (
    ChatCompletionDelta,
    ChatCompletionMessage,
    ChatCompletionResponse,
    ChatCompletionResponseChoice,
    ChatCompletionStreamResponse,
    ChatCompletionStreamResponseChoice,
    ChatCompletionTokenLogprob,
    ChoiceLogprobs,
    CompletionChoice,
    CompletionLogprobs,
    CompletionResponse,
    DetokenizeResponse,
    Embedding,
    EmbeddingResponse,
    EmbeddingUsage,
    Finish,
    Function,
    FunctionCall,
    FunctionDelta,
    ModelCard,
    ModelList,
    PromptTokensDetails,
    Role,
    ScoreEvaluationResponse,
    TokenizeResponse,
    TokenizerInfoResponse,
    ToolCallDelta,
    TopLogprob,
    Usage,
)
from edgeserve.tool_calls import ToolCall
from edgeserve.tool_stream import CallStart, Content, Piece

MESSAGE_ITEMS: Final = 3
"""How many items of a 422 list `error_message` names."""


def new_completion_id() -> str:
    """`chatcmpl-` + 32 lowercase hex digits."""
    return f"chatcmpl-{uuid.uuid4().hex}"


def new_text_completion_id() -> str:
    """`cmpl-` + 32 lowercase hex digits (legacy completions)."""
    return f"cmpl-{uuid.uuid4().hex}"


def new_tool_call_id() -> str:
    """`call_` + 32 lowercase hex digits, fresh for every call (reference section 6)."""
    return f"call_{uuid.uuid4().hex}"


def new_score_id() -> str:
    """`scoreval-` + 32 lowercase hex digits."""
    return f"scoreval-{uuid.uuid4().hex}"


def wire_finish_reason(engine_reason: str) -> Finish:
    """The engine's "stop" stays "stop"; anything else (length, abort) is "length"."""
    return Finish.STOP if engine_reason == "stop" else Finish.LENGTH


def build_usage(
    prompt_tokens: int, completion_tokens: int, cached_tokens: int | None = None
) -> Usage:
    """Token usage; prompt_tokens_details only when the cached count is known."""
    details = None if cached_tokens is None else PromptTokensDetails(cached_tokens=cached_tokens)
    return Usage(
        prompt_tokens=prompt_tokens,
        completion_tokens=completion_tokens,
        total_tokens=prompt_tokens + completion_tokens,
        prompt_tokens_details=details,
    )


def chat_completion_body(
    id: str,
    model: str,
    choices: list[tuple[str, str]],
    prompt_tokens: int,
    completion_tokens: int,
    cached_tokens: int | None,
    *,
    created: int | None = None,
    tool_calls: Sequence[Sequence[ToolCall] | None] | None = None,
    logprobs: Sequence[Sequence[AlignedLogprob]] | None = None,
) -> bytes:
    """The non-stream response: `choices` are (text, engine finish reason) in index order.

    `created` defaults to now. `tool_calls[i]`, when given and non-empty, makes choice i a tool
    call answer (reference section 6): content null, the calls with fresh `call_<32 hex>` ids,
    and finish_reason "tool_calls" whatever the engine's reason was. `logprobs[i]`, when given,
    are choice i's token log-probabilities (the choice then has a `logprobs` key).
    """
    calls = list(tool_calls) if tool_calls is not None else [None] * len(choices)
    entries = list(logprobs) if logprobs is not None else [None] * len(choices)
    response = ChatCompletionResponse(
        id=id,
        created=int(time.time()) if created is None else created,
        model=model,
        choices=[
            _chat_choice(index, text, reason, found, aligned)
            for index, ((text, reason), found, aligned) in enumerate(
                zip(choices, calls, entries, strict=True)
            )
        ],
        usage=build_usage(prompt_tokens, completion_tokens, cached_tokens),
    )
    return response.model_dump_json().encode()


def _chat_choice(
    index: int,
    text: str,
    reason: str,
    calls: Sequence[ToolCall] | None,
    logprobs: Sequence[AlignedLogprob] | None,
) -> ChatCompletionResponseChoice:
    wire_logprobs = None if logprobs is None else chat_logprobs(logprobs)
    if not calls:
        message = ChatCompletionMessage(role=Role.ASSISTANT, content=text)
        return ChatCompletionResponseChoice(
            index=index,
            message=message,
            logprobs=wire_logprobs,
            finish_reason=wire_finish_reason(reason),
        )
    wire_calls = [
        FunctionCall(
            id=new_tool_call_id(), function=Function(name=call.name, arguments=call.arguments)
        )
        for call in calls
    ]
    message = ChatCompletionMessage(role=Role.ASSISTANT, content=None, tool_calls=wire_calls)
    return ChatCompletionResponseChoice(
        index=index, message=message, logprobs=wire_logprobs, finish_reason=Finish.TOOL
    )


def token_text(token: bytes) -> str:
    """A token's bytes as text; bytes that are not whole UTF-8 characters (a token may hold
    part of one) are written as `\\xNN` escapes."""
    return token.decode("utf-8", errors="backslashreplace")


def chat_logprobs(entries: Sequence[AlignedLogprob]) -> ChoiceLogprobs:
    """OpenAI's chat `logprobs` object for these tokens (`refusal` null)."""
    return ChoiceLogprobs(
        content=[
            ChatCompletionTokenLogprob(
                token=token_text(entry.logprob.token),
                logprob=entry.logprob.logprob,
                bytes=list(entry.logprob.token),
                top_logprobs=[
                    TopLogprob(token=token_text(token), logprob=value, bytes=list(token))
                    for token, value in entry.logprob.top
                ],
            )
            for entry in entries
        ],
        refusal=None,
    )


def completion_logprobs(entries: Sequence[AlignedLogprob]) -> CompletionLogprobs:
    """OpenAI's legacy completion `logprobs` object for these tokens (a token with no
    log-probability, an echoed prompt's unpredicted first token, has null alternatives)."""
    return CompletionLogprobs(
        tokens=[token_text(entry.logprob.token) for entry in entries],
        token_logprobs=[entry.logprob.logprob for entry in entries],
        top_logprobs=[
            None
            if entry.logprob.logprob is None
            else {token_text(token): value for token, value in entry.logprob.top}
            for entry in entries
        ],
        text_offset=[entry.text_offset for entry in entries],
    )


def completion_body(
    id: str,
    model: str,
    choices: list[tuple[str, str]],
    prompt_tokens: int,
    completion_tokens: int,
    cached_tokens: int | None = None,
    *,
    created: int | None = None,
    logprobs: Sequence[Sequence[AlignedLogprob]] | None = None,
) -> bytes:
    """A legacy text completion: `choices` are (text, engine finish reason) in index order;
    compact JSON, every field present (`logprobs` null unless `logprobs[i]` gives choice i's
    token log-probabilities). `created` defaults to now."""
    entries = list(logprobs) if logprobs is not None else [None] * len(choices)
    response = CompletionResponse(
        id=id,
        created=int(time.time()) if created is None else created,
        model=model,
        choices=[
            CompletionChoice(
                text=text,
                index=index,
                logprobs=None if aligned is None else completion_logprobs(aligned),
                finish_reason=wire_finish_reason(reason),
            )
            for index, ((text, reason), aligned) in enumerate(zip(choices, entries, strict=True))
        ],
        usage=build_usage(prompt_tokens, completion_tokens, cached_tokens),
    )
    return response.model_dump_json().encode()


def completion_chunk(
    id: str,
    model: str,
    created: int,
    index: int,
    text: str,
    finish_reason: str | None = None,
    logprobs: Sequence[AlignedLogprob] | None = None,
) -> bytes:
    """One streamed completion event: new text for choice `index`, or (with the engine's
    `finish_reason`) the choice's last event, whose text is usually empty; `logprobs`, when
    given, are the tokens whose text this event releases."""
    finish = None if finish_reason is None else wire_finish_reason(finish_reason)
    wire_logprobs = None if logprobs is None else completion_logprobs(logprobs)
    choice = CompletionChoice(text=text, index=index, logprobs=wire_logprobs, finish_reason=finish)
    chunk = CompletionResponse(id=id, created=created, model=model, choices=[choice])
    return sse_event(chunk.model_dump(mode="json", exclude={"usage"}))


def completion_usage_chunk(
    id: str,
    model: str,
    created: int,
    prompt_tokens: int,
    completion_tokens: int,
    cached_tokens: int | None = None,
) -> bytes:
    """The stream_options.include_usage event of a completion stream: no choices, just usage."""
    chunk = CompletionResponse(
        id=id,
        created=created,
        model=model,
        choices=[],
        usage=build_usage(prompt_tokens, completion_tokens, cached_tokens),
    )
    return sse_event(chunk.model_dump(mode="json"))


def sse_event(payload: dict[str, Any] | str) -> bytes:
    """One SSE data event; a str payload (such as "[DONE]") is sent verbatim."""
    data = payload if isinstance(payload, str) else json.dumps(payload, ensure_ascii=False)
    return f"data: {data}\n\n".encode()


def _chunk(
    id: str,
    model: str,
    created: int,
    choices: list[ChatCompletionStreamResponseChoice],
    usage: Usage | None = None,
) -> bytes:
    chunk = ChatCompletionStreamResponse(
        id=id,
        object="chat.completion.chunk",
        created=created,
        model=model,
        choices=choices,
        usage=usage,
    )
    exclude = None if usage is not None else {"usage"}
    return sse_event(chunk.model_dump(mode="json", exclude_unset=True, exclude=exclude))


def role_chunk(id: str, model: str, created: int) -> bytes:
    """The first event: role assistant with empty content."""
    return _delta_chunk(id, model, created, ChatCompletionDelta(role=Role.ASSISTANT, content=""))


def piece_chunks(
    id: str,
    model: str,
    created: int,
    pieces: Sequence[Piece],
    logprobs: Sequence[AlignedLogprob] | None = None,
) -> list[bytes]:
    """One event per piece of a streamed answer: text or, with tool calls (README divergence
    10), a call's start (OpenAI's first chunk of a call: `index`, a fresh `id`, `type`, the
    name and empty `arguments`) or the next piece of its arguments (`index` and `arguments`).
    `logprobs`, when given, are the tokens consumed since the last event; they go with the
    first one."""
    chunks = []
    for piece in pieces:
        if isinstance(piece, Content):
            delta = ChatCompletionDelta(content=piece.text)
        elif isinstance(piece, CallStart):
            function = FunctionDelta(name=piece.name, arguments="")
            call = ToolCallDelta(
                index=piece.index, id=new_tool_call_id(), type="function", function=function
            )
            delta = ChatCompletionDelta(tool_calls=[call])
        else:
            call = ToolCallDelta(index=piece.index, function=FunctionDelta(arguments=piece.text))
            delta = ChatCompletionDelta(tool_calls=[call])
        chunks.append(_delta_chunk(id, model, created, delta, None if chunks else logprobs))
    return chunks


def finish_chunk(
    id: str,
    model: str,
    created: int,
    finish_reason: Finish,
    logprobs: Sequence[AlignedLogprob] | None = None,
) -> bytes:
    """The last event of a choice: empty delta and the true finish reason (divergence 4);
    `logprobs`, when given, are the tokens no earlier event carried."""
    return _delta_chunk(id, model, created, ChatCompletionDelta(), logprobs, finish_reason)


def _delta_chunk(
    id: str,
    model: str,
    created: int,
    delta: ChatCompletionDelta,
    logprobs: Sequence[AlignedLogprob] | None = None,
    finish_reason: Finish | None = None,
) -> bytes:
    choice = ChatCompletionStreamResponseChoice(index=0, delta=delta, finish_reason=finish_reason)
    if logprobs is not None:
        choice.logprobs = chat_logprobs(logprobs)
    return _chunk(id, model, created, [choice])


def usage_chunk(
    id: str,
    model: str,
    created: int,
    prompt_tokens: int,
    completion_tokens: int,
    cached_tokens: int | None = None,
) -> bytes:
    """The stream_options.include_usage event: no choices, just usage."""
    return _chunk(
        id, model, created, [], build_usage(prompt_tokens, completion_tokens, cached_tokens)
    )


def ping_comment(now: datetime) -> bytes:
    """A keep-alive comment as sse-starlette >= 2.1 writes it."""
    return f": ping - {now}\n\n".encode()


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


def embeddings_body(
    model: str,
    vectors: Sequence[np.ndarray],
    encoding_format: Literal["float", "base64"],
    prompt_tokens: int,
) -> bytes:
    """POST /v1/embeddings: the vectors in input order, as floats or (OpenAI's base64) their
    little-endian float32 bytes."""
    data = [
        Embedding(
            index=index,
            embedding=(
                base64.b64encode(vector.astype("<f4").tobytes()).decode("ascii")
                if encoding_format == "base64"
                else vector.tolist()
            ),
        )
        for index, vector in enumerate(vectors)
    ]
    usage = EmbeddingUsage(prompt_tokens=prompt_tokens, total_tokens=prompt_tokens)
    return EmbeddingResponse(data=data, model=model, usage=usage).model_dump_json().encode()


def models_body(model_id: str, created: int) -> bytes:
    """GET /v1/models: one model card."""
    return ModelList(data=[ModelCard(id=model_id, created=created)]).model_dump_json().encode()


def tokenize_body(tokens: list[int], max_model_len: int) -> bytes:
    """POST /tokenize: the tokens, their count and the context size."""
    response = TokenizeResponse(tokens=tokens, count=len(tokens), max_model_len=max_model_len)
    return response.model_dump_json().encode()


def detokenize_body(text: str) -> bytes:
    """POST /detokenize: the text under vLLM's name and llama-server's."""
    return DetokenizeResponse(prompt=text, content=text).model_dump_json().encode()


def tokenizer_info_body(info: TokenizerInfo) -> bytes:
    """GET /tokenizer_info: the engine's description of the tokenizer."""
    return TokenizerInfoResponse(**dataclasses.asdict(info)).model_dump_json().encode()


def error_body(detail: Any, *, with_message: bool) -> bytes:
    """`{"detail": ...}` as compact JSON with raw UTF-8 (unpaired surrogates are escaped).

    With `with_message` (README divergence 12; off with --reference-errors) the body also carries
    `"message": error_message(detail)`, the field OpenAI's SDKs print as the exception text.
    """
    content = {"detail": detail}
    if with_message:
        content["message"] = error_message(detail)
    text = json.dumps(content, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    try:
        return text.encode()
    except UnicodeEncodeError:
        return json.dumps(content, allow_nan=False, separators=(",", ":")).encode()


def error_message(detail: Any) -> str:
    """An error's `detail` as one line: the text itself, or a 422 list summarised as
    `loc: msg` per item (`body.messages.0.role: Input should be ...`), the first
    MESSAGE_ITEMS of them and how many more there are."""
    if isinstance(detail, str):
        return detail
    if not isinstance(detail, list):
        return json.dumps(detail, ensure_ascii=False)
    parts = [_item_summary(item) for item in detail[:MESSAGE_ITEMS]]
    more = len(detail) - MESSAGE_ITEMS
    if more > 0:
        parts.append(f"and {more} more error{'s' if more > 1 else ''}")
    return "; ".join(parts)


def _item_summary(item: Any) -> str:
    """One 422 item as `loc: msg`, with the decoder's reason for a json_invalid item."""
    if not isinstance(item, dict) or "msg" not in item:
        return json.dumps(item, ensure_ascii=False)
    loc = ".".join(str(part) for part in item.get("loc", ()))
    msg = str(item["msg"])
    reason = (item.get("ctx") or {}).get("error")
    if isinstance(reason, str) and reason not in msg:
        msg = f"{msg} ({reason})"
    return f"{loc}: {msg}" if loc else msg


def stream_error_event(status: int, detail: Any) -> bytes:
    """An error after the stream started: one event in the OpenAI error shape (the SDK raises
    APIError on it), carrying the same message as a JSON error would."""
    message = error_message(detail)
    return sse_event({"error": {"message": message, "type": "server_error", "code": status}})
