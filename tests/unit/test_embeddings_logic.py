"""Embeddings without a model: request checks, and how texts are packed into decodes."""

from __future__ import annotations

import pytest

from edgeserve import errors, validation
from edgeserve.engine.jobs import EMBED_MAX_SEQS, EmbedJob
from edgeserve.engine.types import EmbedRequest, TokenPrompt
from edgeserve.protocol import EmbeddingRequest

LIMITS = validation.Limits(max_embed_inputs=3)


def prepare(**body) -> tuple[EmbedRequest, tuple[str, ...]]:
    return validation.prepare_embeddings(EmbeddingRequest(**body), LIMITS, 640)


def test_every_input_shape_becomes_texts_or_token_prompts():
    assert prepare(input="a") == (EmbedRequest(("a",)), ("input",))
    assert prepare(input=["a", "b"]) == (EmbedRequest(("a", "b")), ("input[0]", "input[1]"))
    assert prepare(input=[1, 2]) == (EmbedRequest((TokenPrompt((1, 2)),)), ("input",))
    assert prepare(input=[[1], [2, 3]])[0] == EmbedRequest((TokenPrompt((1,)), TokenPrompt((2, 3))))
    assert prepare(input="a", dimensions=640)[0] == EmbedRequest(("a",))


@pytest.mark.parametrize(
    ("body", "detail"),
    [
        ({"input": []}, validation.Detail.EMPTY_INPUT_LIST),
        ({"input": [[1], []]}, validation.Detail.EMPTY_TOKEN_INPUT.format(where="input[1]")),
        ({"input": ["a"] * 4}, validation.Detail.TOO_MANY_INPUTS.format(count=4, limit=3)),
        (
            {"input": "a", "dimensions": 64},
            validation.Detail.DIMENSIONS_UNSUPPORTED.format(value=64, size=640),
        ),
        ({"input": ["a", "\ud800"]}, validation.Detail.BAD_UNICODE.format(where="input[1]")),
    ],
)
def test_bad_requests_are_400s(body, detail):
    with pytest.raises(errors.ApiError) as info:
        prepare(**body)
    assert (info.value.status, info.value.detail) == (400, detail)


def test_engine_errors_name_the_input():
    names = ("input[0]", "input[1]")
    too_long = validation.embeddings_engine_error(errors.PromptTooLong(9, 4, index=1), names)
    assert too_long.detail == validation.Detail.EMBED_INPUT_TOO_LONG.format(
        where="input[1]", n_prompt=9, n_ctx=4
    )
    unknown = validation.embeddings_engine_error(errors.UnknownToken(2, 99, 50, index=0), names)
    assert '"input[0][2]" is the token id 99' in unknown.detail
    busy = validation.embeddings_engine_error(errors.EngineOverloaded("full"), names)
    assert busy.status == 503


def job(*lengths: int) -> EmbedJob:
    texts = [[1] * n for n in lengths]
    return EmbedJob(rid=1, request=EmbedRequest(()), texts=texts, sink=None)  # type: ignore[arg-type]


def test_a_decode_packs_whole_texts_within_the_budget():
    j = job(3, 4, 5, 1)
    assert j.next_texts(8) == [[1] * 3, [1] * 4]
    j.vectors += [None, None]  # type: ignore[list-item]
    assert j.next_texts(8) == [[1] * 5, [1]]


def test_a_text_over_the_budget_is_decoded_alone():
    assert job(20, 1).next_texts(8) == [[1] * 20]


def test_a_decode_holds_at_most_embed_max_seqs_texts():
    assert len(job(*[1] * (EMBED_MAX_SEQS + 5)).next_texts(10_000)) == EMBED_MAX_SEQS
