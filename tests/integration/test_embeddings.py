"""POST /v1/embeddings against llama.cpp's own embeddings (llama-cpp-python, mean pooling)."""

from __future__ import annotations

import asyncio
import base64

import llama_cpp
import numpy as np
import pytest
from llama_cpp import Llama

from edgeserve.engine import worker
from edgeserve.engine.jobs import EMBED_CHUNK
from tests.integration.conftest import EOS_BAN
from tests.integration.engine_idle import assert_engine_idle, assert_left_work_stops
from tests.integration.sse_client import finished_stream

TEXTS = [
    "Hello world",
    "The quick brown fox jumps over the lazy dog.",
    "a",
    "日本語のテキストです。",
    "Emoji 😀 and accents: café, naïve, Zürich.",
    "def add(a, b):\n    return a + b\n",
    "",
]
MAX_COSINE_DISTANCE = 1e-4
# Over three embeddings decodes (EMBED_CHUNK tokens each) alone, a dozen beside streams.
LONG_TEXT = "The river runs past the old mill and under three stone bridges to the sea. " * 12


def unit(vector: list[float] | np.ndarray) -> np.ndarray:
    array = np.asarray(vector, dtype=np.float64)
    return array / np.linalg.norm(array)


def cosine_distance(a: list[float] | np.ndarray, b: list[float] | np.ndarray) -> float:
    return 1.0 - float(unit(a) @ unit(b))


@pytest.fixture(scope="module")
def llm(model_path) -> Llama:
    llm = Llama(
        str(model_path),
        embedding=True,
        pooling_type=llama_cpp.LLAMA_POOLING_TYPE_MEAN,
        n_ctx=512,
        n_threads=2,
        verbose=False,
    )
    yield llm
    llm.close()


@pytest.fixture(scope="module")
def reference(llm) -> list[np.ndarray]:
    """llama.cpp's own mean-pooled embedding of each text, one at a time, normalised."""
    return [unit(llm.embed(text, normalize=False)) for text in TEXTS]


async def embed(client, inputs, **extra) -> dict:
    resp = await client.post("/v1/embeddings", json={"model": "e", "input": inputs, **extra})
    assert resp.status == 200, await resp.text()
    return await resp.json()


async def test_vectors_equal_llama_cpp_embeddings(client, llm, reference):
    body = await embed(client, TEXTS)
    assert body["object"] == "list" and body["model"] == "e"
    assert [item["index"] for item in body["data"]] == list(range(len(TEXTS)))
    vectors = [item["embedding"] for item in body["data"]]
    for item in body["data"]:
        assert item["object"] == "embedding"
        assert len(item["embedding"]) == llm.n_embd()
        assert abs(np.linalg.norm(item["embedding"]) - 1.0) < 1e-5, "L2-normalised"
    distances = [cosine_distance(v, r) for v, r in zip(vectors, reference, strict=True)]
    assert max(distances) < MAX_COSINE_DISTANCE, distances
    n_tokens = sum(len(llm.tokenize(t.encode(), add_bos=True, special=False)) for t in TEXTS)
    assert body["usage"] == {"prompt_tokens": n_tokens, "total_tokens": n_tokens}


async def test_a_long_text_decoded_in_chunks_equals_llama_cpps_embedding(client, llm, reference):
    assert len(llm.tokenize(LONG_TEXT.encode())) > 3 * EMBED_CHUNK
    expected = unit(llm.embed(LONG_TEXT, normalize=False))
    body = await embed(client, [TEXTS[0], LONG_TEXT, TEXTS[1]])
    vectors = [item["embedding"] for item in body["data"]]
    assert cosine_distance(vectors[0], reference[0]) < MAX_COSINE_DISTANCE
    assert cosine_distance(vectors[1], expected) < MAX_COSINE_DISTANCE
    assert cosine_distance(vectors[2], reference[1]) < MAX_COSINE_DISTANCE


async def test_disconnect_mid_text_leaves_the_engine_idle_and_the_next_vectors_exact(
    client, engine, llm, monkeypatch
):
    # One text of ~1,500 tokens takes ~24 decodes; the client leaves after two, while the
    # text's sequence (0) holds a part of it, which the next text on sequence 0 must not see
    # (the embeddings context is kept meanwhile, not freed as idle).
    monkeypatch.setattr(worker, "SCORE_CONTEXT_IDLE_S", 3600.0)
    steps = engine.steps
    doomed = asyncio.create_task(embed(client, LONG_TEXT * 8))
    while engine.steps < steps + 2:
        await asyncio.sleep(0.005)
    left_at = engine.stats().engine_steps
    doomed.cancel()
    await assert_left_work_stops(engine, left_at)
    await assert_engine_idle(engine)
    body = await embed(client, LONG_TEXT)
    expected = unit(llm.embed(LONG_TEXT, normalize=False))
    assert cosine_distance(body["data"][0]["embedding"], expected) < MAX_COSINE_DISTANCE


async def test_a_batch_gives_the_vectors_of_one_at_a_time(client):
    batch = [item["embedding"] for item in (await embed(client, TEXTS))["data"]]
    for text, vector in zip(TEXTS, batch, strict=True):
        alone = (await embed(client, text))["data"]
        assert len(alone) == 1
        assert cosine_distance(alone[0]["embedding"], vector) < MAX_COSINE_DISTANCE, text


async def test_token_id_inputs_are_embedded_as_given(client, llm, reference):
    ids = [llm.tokenize(t.encode(), add_bos=True, special=False) for t in TEXTS[:3]]
    body = await embed(client, ids)
    for item, ref in zip(body["data"], reference, strict=False):
        assert cosine_distance(item["embedding"], ref) < MAX_COSINE_DISTANCE
    assert body["usage"]["prompt_tokens"] == sum(map(len, ids))
    single = await embed(client, ids[1])
    assert cosine_distance(single["data"][0]["embedding"], reference[1]) < MAX_COSINE_DISTANCE


async def test_base64_is_the_float32_bytes_of_the_vector(client):
    floats = (await embed(client, TEXTS[:2]))["data"]
    packed = (await embed(client, TEXTS[:2], encoding_format="base64"))["data"]
    for f, p in zip(floats, packed, strict=True):
        decoded = np.frombuffer(base64.b64decode(p["embedding"]), dtype="<f4")
        assert decoded.tolist() == f["embedding"]


async def test_vectors_do_not_depend_on_running_chat_streams(client):
    chat = {
        "model": "m",
        "messages": [{"role": "user", "content": "Tell a story."}],
        "max_tokens": 24,
        "logit_bias": EOS_BAN,
        "stream": True,
    }

    async def stream() -> bytes:
        return await (await client.post("/v1/chat/completions", json=chat)).read()

    texts = [LONG_TEXT, *TEXTS[:4]]
    alone = await embed(client, texts)
    results = await asyncio.gather(stream(), embed(client, texts), stream())
    assert finished_stream(results[0])[1] == finished_stream(results[2])[1] == "length"
    for a, b in zip(alone["data"], results[1]["data"], strict=True):
        assert cosine_distance(a["embedding"], b["embedding"]) < MAX_COSINE_DISTANCE


async def test_dimensions_must_be_the_models_size(client, llm):
    ok = await embed(client, "x", dimensions=llm.n_embd())
    assert len(ok["data"][0]["embedding"]) == llm.n_embd()
    resp = await client.post("/v1/embeddings", json={"input": "x", "dimensions": 64})
    assert resp.status == 400
    detail = (await resp.json())["detail"]
    assert '"dimensions" is 64' in detail and f"{llm.n_embd()} dimensions" in detail


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ({"input": []}, '"input" is an empty list'),
        ({"input": [[1, 2], []]}, '"input[1]" is an empty list of token ids'),
        ({"input": [[2, 10**9]]}, '"input[0][1]" is the token id 1000000000'),
        ({"input": ["ok", "word " * 3000]}, '"input[1]" is 3002 tokens but this server embeds at'),
    ],
)
async def test_bad_inputs_are_clear_400s(client, body, expected):
    resp = await client.post("/v1/embeddings", json=body)
    assert resp.status == 400
    assert expected in (await resp.json())["detail"]


async def test_schema_errors_are_422(client):
    resp = await client.post("/v1/embeddings", json={"input": "x", "encoding_format": "int8"})
    assert resp.status == 422
    assert (await resp.json())["detail"][0]["loc"] == ["body", "encoding_format"]
    resp = await client.post("/v1/embeddings", json={"model": "m"})
    assert resp.status == 422


async def test_api_key_is_required_when_set(make_client):
    client = await make_client(api_keys=("k",))
    resp = await client.post("/v1/embeddings", json={"input": "x"})
    assert resp.status == 401
    headers = {"Authorization": "Bearer k"}
    resp = await client.post("/v1/embeddings", json={"input": "x"}, headers=headers)
    assert resp.status == 200


async def test_idle_embeddings_context_is_freed_and_made_again(client, engine, monkeypatch):
    monkeypatch.setattr(worker, "SCORE_CONTEXT_IDLE_S", 0.2)
    first = await embed(client, TEXTS[:2])
    for _ in range(100):
        if not engine.backend.holds_score_context:
            break
        await asyncio.sleep(0.05)
    assert not engine.backend.holds_score_context, "freed after SCORE_CONTEXT_IDLE_S idle"
    again = await embed(client, TEXTS[:2])
    assert again["data"] == first["data"]
    assert engine.backend.holds_score_context
