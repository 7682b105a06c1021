"""Chat `logprobs` / `top_logprobs` through the official `openai` SDK, streamed and not.

End-of-generation tokens are banned so that each choice has exactly max_tokens tokens. Log-probs
come from the model's raw logits, so a banned token may still lead `top_logprobs`."""

from __future__ import annotations

import openai
import pytest

from tests.integration.conftest import EOS_BAN
from tests.sdk.conftest import assert_error_says

CATS = [{"role": "user", "content": "Write one short sentence about cats."}]
FIELDS = {
    "model": "any-model",
    "messages": CATS,
    "max_tokens": 6,
    "temperature": 0,
    "logit_bias": EOS_BAN,
}


def check_entries(entries, content: str, top: int) -> None:
    """Tokens (and their bytes) spell the content; log-probs are ≤ 0; `top` alternatives in
    descending order, which give the sampled token the same value when they include it."""
    assert "".join(entry.token for entry in entries) == content
    assert b"".join(bytes(entry.bytes) for entry in entries) == content.encode()
    for entry in entries:
        assert entry.logprob <= 0.0
        assert len(entry.top_logprobs) == top
        values = [alternative.logprob for alternative in entry.top_logprobs]
        assert values == sorted(values, reverse=True)
        assert all(value <= 0.0 for value in values)
        assert max(values, default=entry.logprob) >= entry.logprob
        same = [alt.logprob for alt in entry.top_logprobs if alt.bytes == entry.bytes]
        assert same in ([], [entry.logprob])
        for alternative in entry.top_logprobs:
            assert alternative.token == bytes(alternative.bytes).decode("utf-8", "backslashreplace")


async def test_non_stream(aclient):
    completion = await aclient.chat.completions.create(**FIELDS, logprobs=True, top_logprobs=3)
    [choice] = completion.choices
    assert choice.logprobs.refusal is None
    entries = choice.logprobs.content
    assert len(entries) == completion.usage.completion_tokens == 6
    check_entries(entries, choice.message.content, 3)


async def test_without_top_logprobs_only_the_sampled_token(aclient):
    completion = await aclient.chat.completions.create(**FIELDS, logprobs=True)
    [choice] = completion.choices
    check_entries(choice.logprobs.content, choice.message.content, 0)


async def test_not_asked_no_logprobs(aclient):
    completion = await aclient.chat.completions.create(**FIELDS, logprobs=False)
    assert completion.choices[0].logprobs is None


async def test_each_choice_has_its_own(aclient):
    completion = await aclient.chat.completions.create(
        **{**FIELDS, "max_tokens": 4}, n=2, seed=1, logprobs=True, top_logprobs=2
    )
    assert len(completion.choices) == 2
    for choice in completion.choices:
        assert len(choice.logprobs.content) == 4
        check_entries(choice.logprobs.content, choice.message.content, 2)


async def test_stream(aclient):
    stream = await aclient.chat.completions.create(
        **FIELDS, logprobs=True, top_logprobs=2, stream=True
    )
    chunks = [chunk.choices[0] async for chunk in stream]
    first, *middle, last = chunks
    assert first.delta.role == "assistant" and first.logprobs is None
    assert last.finish_reason == "length" and last.logprobs is None
    for chunk in middle:
        check_entries(chunk.logprobs.content, chunk.delta.content, 2)
    assert sum(len(chunk.logprobs.content) for chunk in middle) == 6


TOP_WITHOUT = '"top_logprobs" requires "logprobs": true; set it or leave top_logprobs out.'
ERRORS = [
    ("top_logprobs alone", {"top_logprobs": 2}, TOP_WITHOUT),
    ("logprobs false", {"logprobs": False, "top_logprobs": 2}, TOP_WITHOUT),
    (
        "top_logprobs over 20",
        {"logprobs": True, "top_logprobs": 21},
        '"top_logprobs" must be between 0 and 20, got 21.',
    ),
]


@pytest.mark.parametrize(("fields", "detail"), [c[1:] for c in ERRORS], ids=[c[0] for c in ERRORS])
@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
async def test_bad_requests(aclient, fields, detail, stream):
    with pytest.raises(openai.BadRequestError) as caught:
        await aclient.chat.completions.create(**FIELDS, **fields, stream=stream)
    assert_error_says(caught.value, detail)
