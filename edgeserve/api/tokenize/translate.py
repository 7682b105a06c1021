"""POST /tokenize and /detokenize: the schemas, and the text and options of a tokenize request."""

from __future__ import annotations

from typing import Any

from edgeserve.api.reference.detail import Detail
from edgeserve.api.reference.limits import bad, check_unicode
from edgeserve.api.reference.request import parse_body
from edgeserve.api.tokenize.wire import DetokenizeRequest, TokenizeRequest
from edgeserve.engine.types import Tokenization


def parse_tokenize_request(body: Any) -> TokenizeRequest:
    """Validate a decoded body against the /tokenize schema; 422, FastAPI-shaped."""
    return parse_body(TokenizeRequest, body)


def parse_detokenize_request(body: Any) -> DetokenizeRequest:
    """Validate a decoded body against the /detokenize schema; 422, FastAPI-shaped."""
    return parse_body(DetokenizeRequest, body)


def prepare_tokenize(req: TokenizeRequest) -> Tokenization:
    """The text of a /tokenize request, in vLLM's `prompt` or llama-server's `content` (not
    both), and its options: special tokens are added as `add_special_tokens` (vLLM's name) or
    else `add_special` (llama-server's) says, by default as each server does (vLLM adds them,
    llama-server does not); the text of special tokens is read as those tokens unless
    `parse_special` is false."""
    if req.prompt is not None and req.content is not None:
        raise bad(Detail.TOKENIZE_TWO_TEXTS)
    text = req.prompt if req.prompt is not None else req.content
    if text is None:
        raise bad(Detail.TOKENIZE_NO_TEXT)
    check_unicode([("model", req.model), ("prompt" if req.content is None else "content", text)])
    add_special = req.add_special_tokens
    if add_special is None:
        add_special = req.add_special if req.add_special is not None else req.prompt is not None
    return Tokenization(text, add_special=add_special, parse_special=req.parse_special)
