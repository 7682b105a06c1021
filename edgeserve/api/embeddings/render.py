"""POST /v1/embeddings' answer."""

from __future__ import annotations

import base64
from collections.abc import Sequence
from typing import Literal

import numpy as np

from edgeserve.api.embeddings.wire import Embedding, EmbeddingResponse, EmbeddingUsage


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
