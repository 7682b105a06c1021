"""The tokenizer endpoints' answers."""

from __future__ import annotations

import dataclasses

from edgeserve.api.tokenize.wire import DetokenizeResponse, TokenizeResponse, TokenizerInfoResponse
from edgeserve.engine.types import TokenizerInfo


def tokenize_body(tokens: list[int], max_model_len: int) -> bytes:
    """POST /tokenize: the tokens, their count and the context size."""
    response = TokenizeResponse(tokens=tokens, count=len(tokens), max_model_len=max_model_len)
    return response.model_dump_json().encode()


def detokenize_body(text: str) -> bytes:
    """POST /detokenize: the text under vLLM's name and llama-server's."""
    return DetokenizeResponse(prompt=text, content=text).model_dump_json().encode()


def tokenizer_info_body(info: TokenizerInfo, modalities: list[str]) -> bytes:
    """GET /tokenizer_info: the engine's description of the tokenizer, and what the model
    reads besides text."""
    response = TokenizerInfoResponse(**dataclasses.asdict(info), input_modalities=modalities)
    return response.model_dump_json().encode()
