"""Embeddings wire types (OpenAI `POST /v1/embeddings`; the reference has no such endpoint)."""

from __future__ import annotations

from typing import Literal

from edgeserve.api.common.wire import ProtocolModel


class EmbeddingRequest(ProtocolModel):
    """POST /v1/embeddings body: `input` is one text, a list of texts, one list of token ids or
    a list of them. `model` is optional (the served model), as in vLLM and llama-server."""

    model: str | None = None
    input: str | list[str] | list[int] | list[list[int]]
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = None
    user: str | None = None


class Embedding(ProtocolModel):
    """One input's vector: floats, or (base64) its little-endian float32 bytes."""

    object: Literal["embedding"] = "embedding"
    index: int
    embedding: list[float] | str


class EmbeddingUsage(ProtocolModel):
    """Tokens read (an embedding generates none)."""

    prompt_tokens: int
    total_tokens: int


class EmbeddingResponse(ProtocolModel):
    """The vectors in input order."""

    object: Literal["list"] = "list"
    data: list[Embedding]
    model: str
    usage: EmbeddingUsage
