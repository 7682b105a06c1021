"""Legacy text completions through the official `openai` SDK."""

from __future__ import annotations

import asyncio

import openai
import pytest
from openai.types import Completion
from openai.types.completion_choice import Logprobs

from tests.integration.conftest import EOS_BAN
from tests.sdk.conftest import assert_error_says

PROMPT = "Once upon a time"


async def test_sync_client(sync_client):
    completion = await asyncio.to_thread(
        lambda: sync_client.completions.create(
            model="any-model", prompt=PROMPT, max_tokens=5, temperature=0, logit_bias=EOS_BAN
        )
    )
    assert isinstance(completion, Completion)
    assert completion.id.startswith("cmpl-") and completion.object == "text_completion"
    [choice] = completion.choices
    assert choice.index == 0 and choice.finish_reason == "length" and choice.logprobs is None
    assert completion.usage is not None and completion.usage.completion_tokens == 5


async def test_async_stream_equals_non_stream(aclient):
    fields = {
        "model": "any-model",
        "prompt": PROMPT,
        "max_tokens": 6,
        "temperature": 0,
        "logit_bias": EOS_BAN,
    }
    plain = await aclient.completions.create(**fields)
    stream = await aclient.completions.create(
        **fields, stream=True, stream_options={"include_usage": True}
    )
    chunks = [chunk async for chunk in stream]
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == plain.choices[0].text
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == 6
    assert chunks[-2].choices[0].finish_reason == "length"


async def test_list_prompt_n_and_echo(aclient):
    prompts = ["Red", "Blue"]
    completion = await aclient.completions.create(
        model="any-model", prompt=prompts, n=2, max_tokens=2, echo=True, seed=3
    )
    assert [c.index for c in completion.choices] == [0, 1, 2, 3]
    assert all(c.text.startswith(prompts[c.index // 2]) for c in completion.choices)


async def test_unsupported_fields_are_bad_requests(aclient):
    with pytest.raises(openai.BadRequestError) as caught:
        await aclient.completions.create(model="m", prompt=PROMPT, suffix="The end.")
    assert "suffix" in caught.value.body["detail"]
    with pytest.raises(openai.BadRequestError) as caught:
        await aclient.completions.create(model="m", prompt=PROMPT, max_tokens=0)
    assert_error_says(caught.value, '"max_tokens" must be at least 1, got 0.')
    with pytest.raises(openai.BadRequestError) as caught:
        await aclient.completions.create(model="m", prompt=PROMPT, logprobs=21)
    assert_error_says(caught.value, '"logprobs" must be between 0 and 20, got 21.')


def check_logprobs(logprobs, text: str, count: int, top: int) -> None:
    """OpenAI's legacy shape: one entry per token in every list, tokens spelling the text,
    offsets where each token starts, alternatives whose best is at least the sampled token."""
    assert logprobs is not None
    assert len(logprobs.tokens) == count
    assert len(logprobs.token_logprobs) == len(logprobs.top_logprobs) == count
    assert "".join(logprobs.tokens) == text
    starts = [len("".join(logprobs.tokens[:i])) for i in range(count)]
    assert logprobs.text_offset == starts
    for token, value, best in zip(
        logprobs.tokens, logprobs.token_logprobs, logprobs.top_logprobs, strict=True
    ):
        assert value <= 0.0
        assert len(best) <= top and bool(best) == (top > 0)
        assert max(best.values(), default=value) >= value
        if token in best:
            assert best[token] == value


async def test_logprobs_stream_and_non_stream(aclient):
    fields = {
        "model": "any-model",
        "prompt": PROMPT,
        "max_tokens": 5,
        "temperature": 0,
        "logit_bias": EOS_BAN,
        "logprobs": 3,
    }
    plain = await aclient.completions.create(**fields)
    [choice] = plain.choices
    check_logprobs(choice.logprobs, choice.text, 5, 3)
    stream = await aclient.completions.create(**fields, stream=True)
    chunks = [chunk.choices[0] async for chunk in stream]
    for chunk in chunks:
        assert "".join(chunk.logprobs.tokens) == chunk.text
    assert chunks[-1].finish_reason == "length" and chunks[-1].logprobs.tokens == []
    joined = Logprobs(
        **{
            name: [item for c in chunks for item in getattr(c.logprobs, name)]
            for name in ("tokens", "token_logprobs", "top_logprobs", "text_offset")
        }
    )
    check_logprobs(joined, "".join(c.text for c in chunks), 5, 3)


async def test_logprobs_of_every_choice(aclient):
    completion = await aclient.completions.create(
        model="any-model",
        prompt=["Red", "Blue"],
        n=2,
        max_tokens=3,
        seed=5,
        logit_bias=EOS_BAN,
        logprobs=0,
    )
    assert [c.index for c in completion.choices] == [0, 1, 2, 3]
    for choice in completion.choices:
        check_logprobs(choice.logprobs, choice.text, 3, 0)


async def test_echo_with_max_tokens_0_scores_the_prompt(aclient):
    completion = await aclient.completions.create(
        model="any-model", prompt=[PROMPT, "Zürich 😀"], echo=True, max_tokens=0, logprobs=2
    )
    assert completion.usage is not None and completion.usage.completion_tokens == 0
    texts = [PROMPT, "Zürich 😀"]
    counts = []
    for choice, text in zip(completion.choices, texts, strict=True):
        assert (choice.text, choice.finish_reason) == (text, "length")
        counts.append(len(choice.logprobs.tokens))
        check_logprobs(choice.logprobs, text, counts[-1], 2)
    assert completion.usage.prompt_tokens == sum(counts) + 2, "each prompt also has BOS"


async def test_echo_with_logprobs_leads_with_the_prompt_tokens(aclient):
    fields = {"model": "any-model", "prompt": PROMPT, "temperature": 0, "logit_bias": EOS_BAN}
    only = await aclient.completions.create(**fields, echo=True, max_tokens=0, logprobs=1)
    both = await aclient.completions.create(**fields, echo=True, max_tokens=3, logprobs=1)
    prompt_part = only.choices[0].logprobs
    [choice] = both.choices
    n_prompt = len(prompt_part.tokens)
    check_logprobs(choice.logprobs, choice.text, n_prompt + 3, 1)
    assert choice.logprobs.tokens[:n_prompt] == prompt_part.tokens
    assert choice.logprobs.token_logprobs[:n_prompt] == prompt_part.token_logprobs
    stream = await aclient.completions.create(
        **fields, echo=True, max_tokens=0, logprobs=1, stream=True
    )
    [chunk] = [c.choices[0] async for c in stream]
    assert (chunk.text, chunk.finish_reason) == (PROMPT, "length")
    assert chunk.logprobs.token_logprobs == prompt_part.token_logprobs


async def test_token_id_prompts(aclient):
    """The SDK's `prompt=[[ids]]`: the ids as given, the first echoed token with null
    log-probability (nothing predicts it), then one entry per token and the generated one."""
    ids = [818, 5279, 529, 7001, 563]  # "The capital of France is", no BOS
    completion = await aclient.completions.create(
        model="any-model", prompt=[ids, [2, *ids]], echo=True, logprobs=1, max_tokens=1
    )
    for choice, count in zip(completion.choices, (len(ids), len(ids) + 1), strict=True):
        logprobs = choice.logprobs
        assert choice.text.startswith("The capital of France is")
        assert len(logprobs.tokens) == count + 1
        assert logprobs.token_logprobs[0] is None and logprobs.top_logprobs[0] is None
        assert all(value <= 0.0 for value in logprobs.token_logprobs[1:])
    assert completion.usage is not None and completion.usage.prompt_tokens == 2 * len(ids) + 1
