"""POST /tokenize, POST /detokenize and GET /tokenizer_info against the real default model:
vLLM's shapes (what lm-evaluation-harness's remote tokenizer sends), llama-server's, and
their errors (never a 500)."""

from __future__ import annotations

import pytest

from edgeserve.api.reference.detail import Detail
from tests.integration.test_edge_http import KEY, sample, scrape

TEXT = "Once upon a time"
IDS = [14946, 3324, 496, 990]  # TEXT's tokens on Gemma 3
BOS, EOS = 2, 1


def said(detail: str) -> dict[str, str]:
    """An error body: the reference's `detail` and edgeserve's `message`."""
    return {"detail": detail, "message": detail}


async def post(client, path: str, body, headers=None):
    resp = await client.post(path, json=body, headers=headers or {})
    return resp.status, await resp.json()


@pytest.mark.parametrize(
    ("body", "tokens"),
    [
        ({"prompt": TEXT}, [BOS, *IDS]),
        ({"prompt": TEXT, "add_special_tokens": False}, IDS),
        ({"content": TEXT}, IDS),
        ({"content": TEXT, "add_special": True}, [BOS, *IDS]),
        ({"prompt": "<eos>" + TEXT, "add_special_tokens": False}, [EOS, *IDS]),
        ({"content": "<eos>", "parse_special": False}, [236820, 211827, 236813]),
        ({"prompt": "", "model": "anything"}, [BOS]),
    ],
    ids=[
        "vllm",
        "vllm-no-special",
        "llama-server",
        "llama-server-add-special",
        "special-text-parsed",
        "special-text-not-parsed",
        "empty",
    ],
)
async def test_tokenize(client, body, tokens):
    status, data = await post(client, "/tokenize", body)
    assert status == 200, data
    assert data == {"tokens": tokens, "count": len(tokens), "max_model_len": 2048}


async def test_detokenize_gives_the_text_back(client):
    status, data = await post(client, "/detokenize", {"tokens": IDS})
    assert (status, data) == (200, {"prompt": TEXT, "content": TEXT})
    _, data = await post(client, "/detokenize", {"tokens": [BOS, *IDS, EOS], "model": "m"})
    assert data["prompt"] == "<bos>" + TEXT + "<eos>", "special tokens as their text"
    _, data = await post(client, "/detokenize", {"tokens": []})
    assert data == {"prompt": "", "content": ""}


async def test_tokenize_and_detokenize_round_trip_what_lm_eval_sends(client):
    text = "Question: ¿Qué tal? 東京\nAnswer: naïve café"
    _, data = await post(client, "/tokenize", {"prompt": text, "add_special_tokens": False})
    _, back = await post(client, "/detokenize", {"tokens": data["tokens"]})
    assert back["prompt"] == text


async def test_tokenizer_info(client):
    resp = await client.get("/tokenizer_info")
    assert resp.status == 200
    info = await resp.json()
    assert info["eos_token"] == "<eos>" and info["bos_token"] == "<bos>"
    assert info["pad_token"] == "<pad>"
    assert (info["add_bos_token"], info["add_eos_token"]) == (True, False)
    assert (info["model_max_length"], info["vocab_size"]) == (2048, 262144)
    assert info["tokenizer_class"] == "llama"
    assert "<start_of_turn>" in info["chat_template"], "the Gemma fallback the server renders"
    assert info["input_modalities"] == ["text"]


async def test_keys_limits_and_metrics_apply(make_client):
    client = await make_client(api_keys=("k",), root_path="/llm", max_body_bytes=1024)
    for method, path, body in (
        ("POST", "/tokenize", {"prompt": TEXT}),
        ("POST", "/detokenize", {"tokens": IDS}),
        ("GET", "/tokenizer_info", None),
    ):
        resp = await client.request(method, path, json=body)
        assert (resp.status, await resp.json()) == (401, said(Detail.INVALID_API_KEY))
        resp = await client.request(method, "/llm" + path, json=body, headers=KEY)
        assert resp.status == 200, await resp.text()
    status, data = await post(client, "/tokenize", {"prompt": "x" * 2000}, KEY)
    assert (status, data) == (413, said(Detail.BODY_TOO_LARGE.format(limit=1024)))
    found = await scrape(client, KEY)
    for path in ("/tokenize", "/detokenize", "/tokenizer_info"):
        assert sample(found, "edgeserve_requests_total", route=path, status="200") == 1
        assert sample(found, "edgeserve_requests_total", route=path, status="401") == 1


UNKNOWN = (
    '"tokens[{position}]" is the token id {token}, which is not in the vocabulary of this '
    "model (ids 0 to 262143); send ids from its tokenizer (POST /tokenize)."
)


@pytest.mark.parametrize(
    ("path", "body", "status", "detail"),
    [
        ("/detokenize", {"tokens": [2, 262144]}, 400, UNKNOWN.format(position=1, token=262144)),
        ("/detokenize", {"tokens": [-1]}, 400, UNKNOWN.format(position=0, token=-1)),
        ("/detokenize", {"tokens": [2**70]}, 400, UNKNOWN.format(position=0, token=2**70)),
        ("/detokenize", {"tokens": "12"}, 422, None),
        ("/detokenize", {"tokens": [[1]]}, 422, None),
        ("/detokenize", {}, 422, None),
        ("/tokenize", {"prompt": ["a"]}, 422, None),
        ("/tokenize", {"messages": [{"role": "user", "content": "hi"}]}, 400, None),
        ("/tokenize", {"prompt": "a", "content": "a"}, 400, Detail.TOKENIZE_TWO_TEXTS),
        ("/tokenize", [1, 2], 422, None),
    ],
    ids=[
        "past-vocab",
        "negative",
        "huge",
        "string",
        "nested",
        "no-tokens",
        "prompt-list",
        "chat-messages",
        "two-texts",
        "not-an-object",
    ],
)
async def test_errors(client, path, body, status, detail):
    got, data = await post(client, path, body)
    assert got == status, data
    if detail is not None:
        assert data == said(detail)
    elif status == 422:
        assert {"type", "loc", "msg", "input"} <= set(data["detail"][0])
    else:
        assert data["detail"] == Detail.TOKENIZE_NO_TEXT


async def test_malformed_bodies_and_methods(client):
    resp = await client.post(
        "/tokenize", data=b"{not json", headers={"Content-Type": "application/json"}
    )
    assert resp.status == 422 and (await resp.json())["detail"][0]["type"] == "json_invalid"
    resp = await client.post("/detokenize", data=b"\xff\xfe", headers={"Content-Type": "text/x"})
    assert resp.status == 422
    resp = await client.get("/tokenize")
    assert (resp.status, resp.headers["Allow"]) == (405, "POST")
    resp = await client.post("/tokenizer_info", json={})
    assert resp.status == 405


async def test_large_bodies_round_trip(client):
    """Over 256 KiB: parsed, tokenized and answered off the event loop."""
    text = "Once upon a time, " * 20_000
    status, data = await post(client, "/tokenize", {"prompt": text, "add_special_tokens": False})
    assert status == 200 and data["count"] == len(data["tokens"]) > 50_000
    status, back = await post(client, "/detokenize", {"tokens": data["tokens"]})
    assert (status, back["prompt"]) == (200, text)
