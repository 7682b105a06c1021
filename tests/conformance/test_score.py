"""reference-api.md §1.5: POST /v1/score/evaluation, with edgeserve's extensions (reduction,
return_token_logprobs) and its context-overflow 400."""

from __future__ import annotations

import math
import re

import pytest

from tests.conformance.wire import JSON, SCORE, assert_error, compact, detail, post

ID = re.compile(r"scoreval-[0-9a-f]{32}")
TEXTS = [f"Fact {i}: the number {i} comes after {i - 1}." for i in range(1, 11)]
LONG = "The quick brown fox jumps over the lazy dog while the cat sleeps in the warm sun."


def score(*texts: str, model: str = "rm", **fields: object) -> dict[str, object]:
    return {"model": model, "messages": list(texts), **fields}


async def scores_of(client, *texts: str, **fields: object) -> list[float]:
    reply = await post(client, SCORE, score(*texts, **fields))
    assert reply.status == 200, reply.body
    return reply.json()["scores"]


@pytest.mark.parametrize("model", ["rm", "my-org/módel ü"])
async def test_score_response_bytes(client, model):
    reply = await post(client, SCORE, score("Hello world.", "The cat", model=model))
    assert reply.status == 200, reply.body
    assert reply.headers["Content-Type"] == JSON
    assert reply.headers["Content-Length"] == str(len(reply.body))
    body = reply.json()
    assert reply.body == compact(body)
    assert list(body) == ["id", "object", "model", "scores"]  # no created
    assert ID.fullmatch(body["id"])
    assert body["object"] == "score.evaluation" and body["model"] == model
    assert len(body["scores"]) == 2
    assert all(isinstance(s, float) and math.isfinite(s) and s <= 0 for s in body["scores"])


async def test_order_is_preserved_for_ten_texts(client):
    forward = await scores_of(client, *TEXTS)
    backward = await scores_of(client, *reversed(TEXTS))
    assert len(forward) == 10 and len(set(forward)) > 1
    assert backward[::-1] == pytest.approx(forward, abs=1e-3)
    alone = await scores_of(client, TEXTS[6])
    assert alone[0] == pytest.approx(forward[6], abs=1e-3)


async def test_max_length_truncates(client):
    full = await post(client, SCORE, score(LONG, return_token_logprobs=True))
    cut = await post(client, SCORE, score(LONG, max_length=4, return_token_logprobs=True))
    full_lp, cut_lp = full.json()["token_logprobs"][0], cut.json()["token_logprobs"][0]
    assert len(cut_lp) == 3, "BOS plus 3 tokens: 3 scored tokens"
    assert len(full_lp) > 10
    assert cut_lp == pytest.approx(full_lp[:3], abs=1e-3)
    assert cut.json()["scores"][0] != pytest.approx(full.json()["scores"][0], abs=1e-3)
    longer = await scores_of(client, LONG, max_length=10_000)
    assert longer == pytest.approx(full.json()["scores"], abs=1e-3)


async def test_reduction_sum_and_token_logprobs(client):
    mean = await post(client, SCORE, score(LONG, "Hi", return_token_logprobs=True))
    summed = await post(client, SCORE, score(LONG, "Hi", reduction="sum"))
    assert list(mean.json()) == ["id", "object", "model", "scores", "token_logprobs"]
    assert list(summed.json()) == ["id", "object", "model", "scores"]
    per_token = mean.json()["token_logprobs"]
    assert len(per_token) == 2
    for text_lp, mean_score, sum_score in zip(
        per_token, mean.json()["scores"], summed.json()["scores"], strict=True
    ):
        assert all(isinstance(x, float) and x <= 0 for x in text_lp)
        assert mean_score == pytest.approx(math.fsum(text_lp) / len(text_lp), abs=1e-4)
        assert sum_score == pytest.approx(math.fsum(text_lp), abs=1e-3)


@pytest.mark.parametrize(
    ("body", "status", "expected"),
    [
        pytest.param(score(), 400, "Invalid request", id="empty"),
        pytest.param(
            score("a", max_length=0),
            400,
            '"max_length" must be at least 1, got 0.',
            id="max_length-0",
        ),
        pytest.param(
            score("a", max_length=-3),
            400,
            '"max_length" must be at least 1, got -3.',
            id="max_length-negative",
        ),
        pytest.param(
            score("a", reduction="median"),
            422,
            [
                {
                    "type": "literal_error",
                    "loc": ["body", "reduction"],
                    "msg": "Input should be 'mean' or 'sum'",
                    "input": "median",
                    "ctx": {"expected": "'mean' or 'sum'"},
                }
            ],
            id="reduction-median",
        ),
        pytest.param(
            score("a", None),
            422,
            [
                {
                    "type": "string_type",
                    "loc": ["body", "messages", 1],
                    "msg": "Input should be a valid string",
                    "input": None,
                }
            ],
            id="null-text",
        ),
        pytest.param(
            score("a", "\ud800"),
            400,
            "messages[1] contains an unpaired UTF-16 surrogate; send valid Unicode text.",
            id="lone-surrogate",
        ),
    ],
)
async def test_score_errors(client, body, status, expected):
    assert_error(await post(client, SCORE, body), status, detail(expected))


@pytest.mark.parametrize("index", [0, 1])
async def test_text_longer_than_the_context(client, index):
    texts = ["short", "short"]
    texts[index] = "word " * 3000
    reply = await post(client, SCORE, score(*texts))
    assert reply.status == 400, reply.body
    assert reply.headers["Content-Type"] == JSON
    text = reply.json()["detail"]
    match = re.fullmatch(
        rf"Text {index} \(messages\[{index}\]\) is (\d+) tokens but the context window is "
        r"2048 tokens; shorten it or set max_length\.",
        text,
    )
    assert match, text
    assert int(match.group(1)) > 2048
    assert reply.body == detail(text)
    fits = await scores_of(client, *texts, max_length=64)
    assert len(fits) == 2
