"""POST /v1/completions with token-id prompts, without `model`, and the echoed log-probability
layout lm-evaluation-harness relies on, against the real default model."""

from __future__ import annotations

import json

import pytest

from tests.integration.conftest import EOS_BAN
from tests.integration.sse_client import parse_events

URL = "/v1/completions"
CONTEXT, CONTINUATION = "The capital of France is", " Paris"
BOS = 2


async def complete(client, **fields):
    resp = await client.post(URL, json=fields)
    data = await resp.json()
    assert resp.status == 200, data
    return data


async def tokens(client, text: str, special: bool = True) -> list[int]:
    resp = await client.post("/tokenize", json={"prompt": text, "add_special_tokens": special})
    return (await resp.json())["tokens"]


async def test_token_prompt_answers_as_its_text(client):
    """The text's own tokens, BOS included, as ids: the same prompt, the same greedy answer."""
    fields = {"max_tokens": 5, "temperature": 0, "logit_bias": EOS_BAN}
    text = await complete(client, model="m", prompt=CONTEXT, **fields)
    ids = await tokens(client, CONTEXT)
    by_ids = await complete(client, model="m", prompt=ids, **fields)
    assert by_ids["choices"][0]["text"] == text["choices"][0]["text"]
    assert by_ids["usage"]["prompt_tokens"] == len(ids) == text["usage"]["prompt_tokens"]


async def test_token_id_lists_and_no_model(client):
    """`model` may be left out (the served model's name is answered); each token-id list is a
    prompt of its own, in OpenAI's choice order."""
    first, second = await tokens(client, "One, two,", False), await tokens(client, "Red, green,")
    data = await complete(
        client, prompt=[first, second], n=2, max_tokens=2, seed=3, logit_bias=EOS_BAN, echo=True
    )
    assert data["model"] == "gemma-test"
    assert [c["index"] for c in data["choices"]] == [0, 1, 2, 3]
    for choice in data["choices"]:
        lead = "One, two," if choice["index"] < 2 else "Red, green,"
        assert choice["text"].startswith(lead) and choice["text"] != lead
    assert data["usage"]["prompt_tokens"] == len(first) + len(second)


def check_layout(logprobs: dict, text: str) -> None:
    """OpenAI's legacy layout: parallel lists; the tokens spell the text at their offsets."""
    n = len(logprobs["tokens"])
    assert all(len(logprobs[key]) == n for key in ("token_logprobs", "top_logprobs"))
    assert "".join(logprobs["tokens"]) == text
    offsets = [len("".join(logprobs["tokens"][:i])) for i in range(n)]
    assert logprobs["text_offset"] == offsets


@pytest.mark.parametrize("bos", [True, False], ids=["with-bos", "without-bos"])
async def test_echo_has_one_entry_per_prompt_token_plus_the_generated_one(client, bos):
    """lm-eval's layout: `token_logprobs[ctxlen:-1]` is the continuation's log-likelihood. A
    token prompt's first token has null value and alternatives (nothing predicts it)."""
    ids = await tokens(client, CONTEXT + CONTINUATION, special=bos)
    ctxlen = len(await tokens(client, CONTEXT, special=bos))
    echo = {"echo": True, "logprobs": 1, "max_tokens": 1, "temperature": 0, "seed": 1234}
    data = await complete(client, model="m", prompt=[ids], **echo)
    logprobs = data["choices"][0]["logprobs"]
    check_layout(logprobs, data["choices"][0]["text"])
    assert len(logprobs["token_logprobs"]) == len(ids) + 1
    assert logprobs["token_logprobs"][0] is None and logprobs["top_logprobs"][0] is None
    assert all(value is not None for value in logprobs["token_logprobs"][1:])
    assert all(len(top) == 1 for top in logprobs["top_logprobs"][1:])
    if not bos:
        return
    text = await complete(client, model="m", prompt=CONTEXT + CONTINUATION, **echo)
    by_text = text["choices"][0]["logprobs"]["token_logprobs"]
    assert len(by_text) == len(ids), "the text's tokens (BOS is the server's) plus one"
    assert logprobs["token_logprobs"][1:-1] == by_text[:-1], "the same values, shifted by BOS"
    resp = await client.post(
        "/v1/score/evaluation",
        json={"model": "m", "messages": [CONTEXT + CONTINUATION], "return_token_logprobs": True},
    )
    scored = (await resp.json())["token_logprobs"][0]
    continuation = len(ids) - ctxlen
    assert sum(logprobs["token_logprobs"][ctxlen:-1]) == pytest.approx(
        sum(scored[-continuation:]), abs=1e-9
    )


async def test_a_generated_end_of_text_keeps_its_entry(client):
    """When the one generated token is EOS (forced here), its entry still ends the list: the
    echoed prompt's entries are not shifted into the generated slot."""
    ids = await tokens(client, CONTEXT)
    fields = {"echo": True, "logprobs": 1, "max_tokens": 1, "logit_bias": {"1": 100}}
    data = await complete(client, model="m", prompt=ids, **fields)
    choice = data["choices"][0]
    assert choice["finish_reason"] == "stop" and choice["text"] == CONTEXT
    assert len(choice["logprobs"]["tokens"]) == len(ids) + 1
    assert choice["logprobs"]["tokens"][-1] == ""
    assert choice["logprobs"]["text_offset"][-1] == len(CONTEXT)
    resp = await client.post(URL, json={"prompt": ids, "stream": True, **fields})
    events, done = parse_events(await resp.read())
    assert done
    streamed = [t for e in events for t in (e["choices"][0]["logprobs"] or {}).get("tokens", [])]
    assert streamed == choice["logprobs"]["tokens"]


async def test_echo_only_scores_token_prompts(client):
    """`max_tokens: 0` with `echo`: the prompt's entries alone, no generation."""
    ids = [BOS, *await tokens(client, CONTEXT, False)]
    data = await complete(client, prompt=[ids, ids[1:]], echo=True, max_tokens=0, logprobs=0)
    with_bos, without = (c["logprobs"]["token_logprobs"] for c in data["choices"])
    assert len(with_bos) == len(ids) and len(without) == len(ids) - 1
    assert with_bos[0] is None and without[0] is None
    assert [c["text"] for c in data["choices"]] == [CONTEXT, CONTEXT]
    assert data["usage"] == {
        "prompt_tokens": 2 * len(ids) - 1,
        "completion_tokens": 0,
        "total_tokens": 2 * len(ids) - 1,
    }


UNKNOWN = (
    '"{where}" is the token id {token}, which is not in the vocabulary of this model (ids 0 to '
    "262143); send ids from its tokenizer (POST /tokenize)."
)


@pytest.mark.parametrize(
    ("fields", "status", "detail"),
    [
        ({"prompt": [2, 262144]}, 400, UNKNOWN.format(where="prompt[1]", token=262144)),
        ({"prompt": [[2, 3], [2, -5]]}, 400, UNKNOWN.format(where="prompt[1][1]", token=-5)),
        (
            {"prompt": [[2], [9, 2**40]], "echo": True, "max_tokens": 0},
            400,
            UNKNOWN.format(where="prompt[1][1]", token=2**40),
        ),
        (
            {"prompt": [7, 999999], "echo": True, "logprobs": 1, "stream": True},
            400,
            UNKNOWN.format(where="prompt[1]", token=999999),
        ),
        (
            {"prompt": [[5] * 3000]},
            400,
            '"prompt[0]" is 3000 tokens but the context window is 2048 tokens; shorten it (it '
            "must leave room for at least one new token).",
        ),
        ({"prompt": []}, 400, None),
        ({"prompt": [[2], []]}, 400, None),
        ({"prompt": [[2], "text"]}, 422, None),
        ({"prompt": [1.5]}, 422, None),
        ({"prompt": {"ids": [1]}}, 422, None),
    ],
    ids=[
        "past-vocab",
        "negative-in-list",
        "echo-only",
        "stream",
        "too-long",
        "empty-list",
        "empty-token-list",
        "mixed",
        "float",
        "object",
    ],
)
async def test_bad_token_prompts(client, fields, status, detail):
    resp = await client.post(URL, json={"max_tokens": 1, **fields})
    assert resp.status == status, await resp.text()
    assert resp.headers["Content-Type"] == "application/json"
    body = json.loads(await resp.read())
    if detail is not None:
        assert body == {"detail": detail, "message": detail}
    elif status == 400:
        assert "empty list" in body["detail"]
