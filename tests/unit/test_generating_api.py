"""api/common/generating_api.py: `Choices` turns engine events into a renderer's calls (stream)
or whole answers (collect), `TokenUsage` counts them. The renderer here is a recording fake."""

from __future__ import annotations

import random
from collections.abc import Sequence

import pytest

from edgeserve.api.common.generating_api import (
    ChoiceAnswer,
    ChoiceEnd,
    Choices,
    Event,
    GenerationWork,
    TokenUsage,
)
from edgeserve.api.common.logprobs import AlignedLogprob, LogprobAligner
from edgeserve.api.common.tool_stream import CallStart, Content, Piece
from edgeserve.engine.types import (
    Finished,
    GenerationRequest,
    SamplingParams,
    TextDelta,
    TokenLogprob,
)
from edgeserve.errors import ApiError

CALL = '{"name": "get_weather", "arguments": {"city": "Paris"}}'


class RecordingFakeRenderer:
    """Records what `Choices` hands it and whether it sent an event (and so took the entries);
    pieces whose text is in `silent` produce no event, as a renderer that holds text back would."""

    def __init__(self, silent: frozenset[str] = frozenset()) -> None:
        self.silent = silent
        self.calls: list[tuple[str, int, object, list[AlignedLogprob] | None]] = []
        self.took: list[bool] = []

    def aligner(self) -> LogprobAligner:
        return LogprobAligner()

    def body(self, answers: Sequence[ChoiceAnswer], usage: TokenUsage) -> bytes:
        return b""

    def start(self) -> list[bytes]:
        return []

    def pieces(
        self, index: int, pieces: Sequence[Piece], logprobs: list[AlignedLogprob] | None
    ) -> list[bytes]:
        self.calls.append(("pieces", index, list(pieces), logprobs))
        loud = [p for p in pieces if not (isinstance(p, Content) and p.text in self.silent)]
        self.took.append(bool(loud))
        return [b"event"] * len(loud)

    def finish(self, end: ChoiceEnd, usage: TokenUsage) -> list[bytes]:
        reason = (end.finished.reason, end.called)
        self.calls.append(("finish", end.finished.index, reason, end.logprobs))
        self.took.append(True)
        return [b"finish"]

    def end(self, usage: TokenUsage) -> list[bytes]:
        return []

    def failure(self, err: ApiError) -> list[bytes]:
        return []


def work(*, n: int = 1, prompts: int = 1, tools: bool = False, logprobs: bool = True):
    request = GenerationRequest(prompt="p", params=SamplingParams(), n=n)
    return GenerationWork((request,) * prompts, n=n, tools=tools, logprobs=logprobs)


def token_events(index: int, words: list[str]) -> list[Event]:
    """Each word as its token's log-prob, then its text: what the engine sends."""
    events: list[Event] = []
    for word in words:
        events.append(TokenLogprob(index, word.encode(), -1.0))
        events.append(TextDelta(index, word))
    return events


def handed(renderer: RecordingFakeRenderer, index: int) -> list[bytes]:
    """The entries of choice `index` that went out with an event."""
    return [
        entry.logprob.token
        for (_, at, _, entries), took in zip(renderer.calls, renderer.took, strict=True)
        if at == index and took and entries
        for entry in entries
    ]


@pytest.mark.parametrize("seed", range(20))
def test_every_entry_reaches_the_renderer_once_and_in_order(seed):
    rng = random.Random(seed)
    words = [rng.choice(["a", "bb", "held", "c", "held"]) for _ in range(rng.randint(1, 12))]
    renderer = RecordingFakeRenderer(silent=frozenset({"held"}))
    choices = Choices(renderer, work())
    for event in token_events(0, words):
        choices.stream(event, TokenUsage())
    choices.stream(Finished(0, "stop", len(words)), TokenUsage())
    assert handed(renderer, 0) == [word.encode() for word in words]
    assert renderer.calls[-1][0] == "finish"


def test_entries_wait_for_an_event_that_carries_them():
    renderer = RecordingFakeRenderer(silent=frozenset({"held"}))
    choices = Choices(renderer, work())
    for event in token_events(0, ["held", "x"]):
        choices.stream(event, TokenUsage())
    pieces = [call for call in renderer.calls if call[0] == "pieces"]
    assert [[e.logprob.token for e in call[3] or []] for call in pieces] == [
        [b"held"],
        [b"held", b"x"],
    ]


def test_without_logprobs_the_renderer_gets_none():
    renderer = RecordingFakeRenderer()
    choices = Choices(renderer, work(logprobs=False))
    for event in [*token_events(0, ["a"]), Finished(0, "length", 1)]:
        choices.stream(event, TokenUsage())
    assert all(call[3] is None for call in renderer.calls)


def test_a_streamed_call_is_read_and_finishes_as_called():
    renderer = RecordingFakeRenderer()
    choices = Choices(renderer, work(tools=True, logprobs=False))
    for char in CALL:
        choices.stream(TextDelta(0, char), TokenUsage())
    choices.stream(Finished(0, "stop", 9), TokenUsage())
    pieces = [p for kind, _, ps, _ in renderer.calls if kind == "pieces" for p in ps]
    assert CallStart(0, "get_weather") in pieces
    assert not any(isinstance(p, Content) and p.text for p in pieces)
    assert renderer.calls[-1][2] == ("stop", True)


def test_without_tools_a_call_shaped_answer_is_text():
    renderer = RecordingFakeRenderer()
    choices = Choices(renderer, work(tools=False, logprobs=False))
    choices.stream(TextDelta(0, CALL), TokenUsage())
    choices.stream(Finished(0, "stop", 9), TokenUsage())
    assert renderer.calls[0][2] == [Content(CALL)]
    assert renderer.calls[-1][2] == ("stop", False)


@pytest.mark.parametrize("tools", [True, False])
def test_collect_keeps_text_reason_and_calls(tools):
    choices = Choices(RecordingFakeRenderer(), work(n=2, tools=tools))
    events = [
        *token_events(1, ["Hi", " there"]),
        TextDelta(0, CALL),
        Finished(1, "length", 2),
        Finished(0, "stop", 9),
    ]
    for event in events:
        choices.collect(event)
    first, second = choices.answers
    assert (second.text, second.reason, second.calls) == ("Hi there", "length", None)
    assert [e.logprob.token for e in second.logprobs] == [b"Hi", b" there"]
    assert first.finished == Finished(0, "stop", 9)
    assert (first.calls is not None) is tools
    if tools:
        assert [(c.name, c.arguments) for c in first.calls] == [
            ("get_weather", '{"city": "Paris"}')
        ]


def test_usage_counts_each_prompt_once_and_every_choice():
    usage = TokenUsage(prompt_tokens=30)
    for event in [
        TextDelta(0, "a"),
        Finished(0, "stop", 3, cached_tokens=4),
        Finished(1, "stop", 5, cached_tokens=4),
        Finished(2, "length", 7, cached_tokens=6),
        Finished(3, "length", 7, cached_tokens=6),
    ]:
        usage.account(event, n=2)
    assert usage.completion_tokens == 22
    assert usage.cached_tokens == 10
    assert usage.first_text_at is not None


def test_usage_counts_the_tokens_of_choices_cut_short():
    usage = TokenUsage(prompt_tokens=10)
    for event in [
        TextDelta(0, "a", generated=1, cached=6),
        TextDelta(1, "b", generated=2, cached=6),
        TextDelta(0, "cd", generated=3, cached=6),
        Finished(1, "stop", 4, cached_tokens=6),
        TextDelta(2, "e", generated=1, cached=2),
    ]:
        usage.account(event, n=2)
    assert usage.generated == {0: 3, 1: 4, 2: 1}
    assert usage.completion_tokens == 8
    assert usage.cached == {0: 6, 1: 2}
    assert usage.cached_tokens == 8


def test_work_counts_its_choices():
    assert work(n=3, prompts=2).choices == 6
