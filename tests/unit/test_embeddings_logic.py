"""Embeddings without a model: request checks, and how texts are packed into decodes."""

from __future__ import annotations

import numpy as np
import pytest

from edgeserve import errors
from edgeserve.api.embeddings.translate import embeddings_engine_error, prepare_embeddings
from edgeserve.api.embeddings.wire import EmbeddingRequest
from edgeserve.api.reference.detail import Detail
from edgeserve.api.reference.limits import Limits
from edgeserve.engine.jobs import EMBED_MAX_SEQS, EmbedJob
from edgeserve.engine.types import EmbedRequest, TokenPrompt

LIMITS = Limits(max_embed_inputs=3)


def prepare(**body) -> tuple[EmbedRequest, tuple[str, ...]]:
    return prepare_embeddings(EmbeddingRequest(**body), LIMITS, 640)


def test_every_input_shape_becomes_texts_or_token_prompts():
    assert prepare(input="a") == (EmbedRequest(("a",)), ("input",))
    assert prepare(input=["a", "b"]) == (EmbedRequest(("a", "b")), ("input[0]", "input[1]"))
    assert prepare(input=[1, 2]) == (EmbedRequest((TokenPrompt((1, 2)),)), ("input",))
    assert prepare(input=[[1], [2, 3]])[0] == EmbedRequest((TokenPrompt((1,)), TokenPrompt((2, 3))))
    assert prepare(input="a", dimensions=640)[0] == EmbedRequest(("a",))


@pytest.mark.parametrize(
    ("body", "detail"),
    [
        ({"input": []}, Detail.EMPTY_INPUT_LIST),
        ({"input": [[1], []]}, Detail.EMPTY_TOKEN_INPUT.format(where="input[1]")),
        ({"input": ["a"] * 4}, Detail.TOO_MANY_INPUTS.format(count=4, limit=3)),
        (
            {"input": "a", "dimensions": 64},
            Detail.DIMENSIONS_UNSUPPORTED.format(value=64, size=640),
        ),
        ({"input": ["a", "\ud800"]}, Detail.BAD_UNICODE.format(where="input[1]")),
    ],
)
def test_bad_requests_are_400s(body, detail):
    with pytest.raises(errors.ApiError) as info:
        prepare(**body)
    assert (info.value.status, info.value.detail) == (400, detail)


def test_engine_errors_name_the_input():
    names = ("input[0]", "input[1]")
    too_long = embeddings_engine_error(errors.PromptTooLong(9, 4, index=1), names)
    assert too_long.detail == Detail.EMBED_INPUT_TOO_LONG.format(
        where="input[1]", n_prompt=9, n_ctx=4
    )
    unknown = embeddings_engine_error(errors.UnknownToken(2, 99, 50, index=0), names)
    assert '"input[0][2]" is the token id 99' in unknown.detail
    busy = embeddings_engine_error(errors.EngineOverloaded("full"), names)
    assert busy.status == 503


def job(*lengths: int, whole_texts: bool = True) -> EmbedJob:
    texts = [list(range(n)) for n in lengths]
    request = EmbedRequest(())
    return EmbedJob(rid=1, request=request, texts=texts, sink=None, whole_texts=whole_texts)  # type: ignore[arg-type]


def spans(j: EmbedJob, budget: int) -> list[tuple[int, int, int, bool]]:
    """(seq, start, length, last) of each span of the next decode."""
    return [(s.seq, s.start, len(s.tokens), s.last) for s in j.next_spans(budget)]


def decode(j: EmbedJob, budget: int) -> list[tuple[int, int, int, bool]]:
    """Plan the next decode and record it as done (a vector for each span that ends a text)."""
    planned = j.next_spans(budget)
    j.record(planned, [np.zeros(2) if s.last else None for s in planned])
    return [(s.seq, s.start, len(s.tokens), s.last) for s in planned]


def test_a_decode_packs_whole_texts_within_the_budget():
    j = job(3, 4, 5, 1)
    assert decode(j, 8) == [(0, 0, 3, True), (1, 0, 4, True)]
    assert decode(j, 8) == [(2, 0, 5, True), (3, 0, 1, True)]
    assert j.done


def test_a_whole_text_over_the_budget_is_decoded_alone():
    assert spans(job(20, 1), 8) == [(0, 0, 20, True)]
    assert spans(job(1, 20), 8) == [(0, 0, 1, True)]


def test_a_splittable_text_is_cut_at_the_budget_and_continued_on_its_sequence():
    j = job(3, 20, 2, whole_texts=False)
    assert decode(j, 8) == [(0, 0, 3, True), (1, 0, 5, False)]
    assert j.fed == 5 and len(j.vectors) == 1
    assert decode(j, 8) == [(1, 5, 8, False)]
    assert decode(j, 8) == [(1, 13, 7, True), (2, 0, 1, False)]
    assert decode(j, 8) == [(2, 1, 1, True)]
    assert j.done and j.fed == 0


def test_spans_carry_the_texts_own_tokens():
    j = job(10, whole_texts=False)
    first = j.next_spans(4)
    j.record(first, [None])
    rest = j.next_spans(100)
    assert list(first[0].tokens) + list(rest[0].tokens) == list(range(10))


def test_a_decode_holds_at_most_embed_max_seqs_texts_on_distinct_sequences():
    j = job(*[1] * (EMBED_MAX_SEQS + 5))
    planned = j.next_spans(10_000)
    assert len(planned) == EMBED_MAX_SEQS
    assert len({s.seq for s in planned}) == EMBED_MAX_SEQS
