"""--embedding-model: a dedicated embedding GGUF (a tiny BERT written by the tests) loaded
beside the chat model; /v1/embeddings reads it with its own pooling, chat still reads the
chat model."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import gguf
import numpy as np
import pytest
from llama_cpp import Llama

from edgeserve.config import Settings
from edgeserve.engine.client import EngineClient
from edgeserve.engine.llama.model import ModelLoadError
from edgeserve.engine.types import EngineConfig
from edgeserve.engine.worker import Engine
from edgeserve.http.app import create_app
from tests.fixtures.tiny_reranker import N_EMBD, write_tiny_embedder, write_tiny_reranker
from tests.integration.conftest import EOS_BAN

TEXTS = ["What is the capital of France?", "Paris is the capital city of France.", "cats"]


def start_engine(model_path: Path, embedding_model: Path) -> Engine:
    engine = Engine(
        EngineConfig(
            model_path=str(model_path),
            embedding_model_path=str(embedding_model),
            n_ctx=512,
            parallel=2,
            n_threads=2,
        )
    )
    engine.start()
    engine.wait_loaded(120)
    return engine


@pytest.fixture(scope="module", params=[gguf.PoolingType.CLS, gguf.PoolingType.MEAN])
def embedder(request, tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("embed") / f"tiny-embed-{request.param.name}.gguf"
    return write_tiny_embedder(path, pooling=request.param)


@pytest.fixture(scope="module")
def embed_engine(model_path, embedder) -> Iterator[Engine]:
    engine = start_engine(model_path, embedder)
    assert engine.loaded, engine.load_error
    yield engine
    engine.close()


@pytest.fixture
async def embed_client(aiohttp_client, embed_engine, model_path, embedder):
    settings = Settings(model=str(model_path), embedding_model=str(embedder))
    return await aiohttp_client(create_app(settings, EngineClient(embed_engine)))


def reference(path: Path, texts: list[str]) -> list[np.ndarray]:
    """llama.cpp's own embedding of each text alone, pooled as the model says, normalised."""
    llm = Llama(str(path), embedding=True, n_threads=2, verbose=False)
    try:
        vectors = [np.asarray(llm.embed(text, normalize=False), dtype=np.float64) for text in texts]
    finally:
        llm.close()
    return [v / np.linalg.norm(v) for v in vectors]


async def test_vectors_are_the_embedding_models_own(embed_client, embedder):
    resp = await embed_client.post("/v1/embeddings", json={"input": TEXTS})
    assert resp.status == 200, await resp.text()
    body = await resp.json()
    vectors = [np.asarray(item["embedding"]) for item in body["data"]]
    assert {len(v) for v in vectors} == {N_EMBD}
    for vector, ref in zip(vectors, reference(embedder, TEXTS), strict=True):
        assert 1.0 - float(vector @ ref) < 1e-4


async def test_dimensions_are_the_embedding_models(embed_client):
    ok = await embed_client.post("/v1/embeddings", json={"input": "cats", "dimensions": N_EMBD})
    assert ok.status == 200
    resp = await embed_client.post("/v1/embeddings", json={"input": "cats", "dimensions": 640})
    assert resp.status == 400
    assert f"have {N_EMBD} dimensions" in (await resp.json())["detail"]


async def test_token_ids_are_checked_against_the_embedding_models_vocabulary(embed_client):
    resp = await embed_client.post("/v1/embeddings", json={"input": [[2, 5000]]})
    assert resp.status == 400
    assert '"input[0][1]" is the token id 5000' in (await resp.json())["detail"]


async def test_chat_still_reads_the_chat_model(embed_client):
    chat = {
        "model": "m",
        "messages": [{"role": "user", "content": "Hi"}],
        "max_tokens": 3,
        "logit_bias": EOS_BAN,
    }
    resp = await embed_client.post("/v1/chat/completions", json=chat)
    assert resp.status == 200
    assert (await resp.json())["usage"]["completion_tokens"] == 3


def test_a_reranker_is_refused_as_embedding_model(model_path, tmp_path):
    reranker = write_tiny_reranker(tmp_path / "rerank.gguf")
    engine = start_engine(model_path, reranker)
    engine.wait_stopped()
    assert isinstance(engine.load_error, ModelLoadError)
    assert "is a reranker (rank pooling), not an embedding model" in str(engine.load_error)
