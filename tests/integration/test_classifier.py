"""A classifier / reranker GGUF (rank pooling), made at test time: scores are the head's
output, chat is 405 "Not allowed"."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import llama_cpp
import pytest

from edgeserve.config import Settings
from edgeserve.engine.client import EngineClient
from edgeserve.engine.types import EngineConfig
from edgeserve.engine.worker import Engine
from edgeserve.http.app import create_app
from tests.fixtures.check_tiny_reranker import (
    load_model,
    make_context,
    score_sequences,
    tokenize,
)
from tests.fixtures.tiny_reranker import write_tiny_reranker

TEXTS = ["What is the capital of France?", "Paris is the capital city of France.", "cats"]


@pytest.fixture(scope="module")
def reranker(tmp_path_factory) -> Path:
    return write_tiny_reranker(tmp_path_factory.mktemp("rerank") / "tiny-reranker.gguf")


@pytest.fixture(scope="module")
def rank_engine(reranker) -> Iterator[Engine]:
    engine = Engine(EngineConfig(model_path=str(reranker), n_ctx=512, parallel=1, n_threads=2))
    engine.start()
    assert engine.wait_loaded(60), engine.load_error
    yield engine
    engine.close()


def reference(path: Path, texts: list[str]) -> list[float]:
    """Each text alone through llama.cpp with RANK pooling: the head's first output."""
    model = load_model(path)
    ctx = make_context(
        model, llama_cpp.LLAMA_POOLING_TYPE_RANK, llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED
    )
    try:
        vocab = llama_cpp.llama_model_get_vocab(model)
        n_out = llama_cpp.llama_model_n_cls_out(model)
        return [
            score_sequences(ctx, [tokenize(vocab, t, add_special=True)], n_out)[0][0] for t in texts
        ]
    finally:
        llama_cpp.llama_free(ctx)
        llama_cpp.llama_model_free(model)


@pytest.fixture
async def rank_client(aiohttp_client, rank_engine, reranker):
    settings = Settings(model=str(reranker), model_name="tiny-reranker")
    return await aiohttp_client(create_app(settings, EngineClient(rank_engine)))


async def test_classifier_scores_are_the_head_output(rank_client, reranker):
    resp = await rank_client.post("/v1/score/evaluation", json={"model": "rm", "messages": TEXTS})
    assert resp.status == 200
    scores = (await resp.json())["scores"]
    expected = reference(reranker, TEXTS)
    assert scores == pytest.approx(expected, abs=1e-5)
    assert len(set(scores)) == len(TEXTS)


@pytest.mark.parametrize("stream", [False, True])
async def test_chat_on_a_classifier_is_405_not_allowed(rank_client, stream):
    body = {"model": "rm", "messages": [], "stream": stream}
    resp = await rank_client.post("/v1/chat/completions", json=body)
    assert resp.status == 405
    assert await resp.read() == b'{"detail":"Not allowed","message":"Not allowed"}'


async def test_classifier_health_reports_ready(rank_client):
    resp = await rank_client.get("/health")
    assert resp.status == 200
