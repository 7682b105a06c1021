"""Embeddings through the official `openai` SDK: floats, base64 (the SDK's default, which it
decodes itself) and errors."""

from __future__ import annotations

import asyncio
import base64

import numpy as np
import openai
import pytest
from openai.types import CreateEmbeddingResponse

from tests.sdk.conftest import assert_error_says

TEXTS = ["Hello world", "The quick brown fox jumps over the lazy dog.", "Paris"]


async def test_float_and_base64_give_the_same_vectors(aclient):
    floats = await aclient.embeddings.create(
        model="any-model", input=TEXTS, encoding_format="float"
    )
    assert isinstance(floats, CreateEmbeddingResponse)
    assert floats.object == "list" and floats.model == "any-model"
    assert [e.index for e in floats.data] == [0, 1, 2]
    assert floats.usage.prompt_tokens == floats.usage.total_tokens > len(TEXTS)
    packed = await aclient.embeddings.create(
        model="any-model", input=TEXTS, encoding_format="base64"
    )
    default = await aclient.embeddings.create(model="any-model", input=TEXTS)
    for f, p, d in zip(floats.data, packed.data, default.data, strict=True):
        assert isinstance(p.embedding, str), "asked for base64, the SDK hands the text over"
        decoded = np.frombuffer(base64.b64decode(p.embedding), dtype="<f4")
        assert decoded.tolist() == f.embedding == d.embedding
        assert abs(np.linalg.norm(f.embedding) - 1.0) < 1e-5


async def test_sync_client_with_token_ids(sync_client):
    tokens = [2, 9259, 1902]
    result = await asyncio.to_thread(
        lambda: sync_client.embeddings.create(model="m", input=[tokens], encoding_format="float")
    )
    assert len(result.data) == 1 and result.usage.prompt_tokens == len(tokens)


async def test_dimensions_other_than_the_models_is_a_bad_request(aclient):
    with pytest.raises(openai.BadRequestError) as info:
        await aclient.embeddings.create(model="m", input="x", dimensions=8)
    size = len((await aclient.embeddings.create(model="m", input="x")).data[0].embedding)
    assert_error_says(
        info.value,
        f'"dimensions" is 8 but this model\'s embeddings have {size} dimensions and cannot be '
        "shortened (its vectors were not trained to be cut); leave it out or send "
        f"{size}.",
    )
