"""edgeserve.logprobs.LogprobAligner: entries are released with the text that covers them."""

from __future__ import annotations

import pytest

from edgeserve.api.common.logprobs import AlignedLogprob, LogprobAligner
from edgeserve.engine.types import Finished, TextDelta, TokenLogprob


def tok(token: bytes, index: int = 0) -> TokenLogprob:
    return TokenLogprob(index, token, -0.5)


def released(aligner: LogprobAligner, event: TextDelta | TokenLogprob | Finished) -> list:
    """(token, text_offset) of each entry the event releases."""
    return [(e.logprob.token, e.text_offset) for e in aligner.feed(event)]


def test_each_token_is_released_with_its_text() -> None:
    aligner = LogprobAligner()
    assert released(aligner, tok(b"Hel")) == []
    assert released(aligner, TextDelta(0, "Hel")) == [(b"Hel", 0)]
    assert released(aligner, tok(b"lo")) == []
    assert released(aligner, TextDelta(0, "lo")) == [(b"lo", 3)]
    assert released(aligner, Finished(0, "stop", 2)) == []


def test_a_character_split_across_tokens_releases_both_at_once() -> None:
    aligner = LogprobAligner()
    for token in (b"a\xc3", b"\xa9", b"b"):
        assert released(aligner, tok(token)) == []
    assert released(aligner, TextDelta(0, "aé")) == [(b"a\xc3", 0), (b"\xa9", 2)]
    assert released(aligner, TextDelta(0, "b")) == [(b"b", 2)]


def test_offsets_count_characters_not_bytes() -> None:
    aligner = LogprobAligner()
    feed = [tok("né".encode()), tok(b" x"), TextDelta(0, "né x")]
    out = [entry for event in feed for entry in aligner.feed(event)]
    assert [entry.text_offset for entry in out] == [0, 2]


def test_held_back_text_releases_its_tokens_later() -> None:
    aligner = LogprobAligner()
    assert released(aligner, tok(b"Hello")) == []
    assert released(aligner, TextDelta(0, "Hel")) == []
    assert released(aligner, tok(b" wo")) == []
    assert released(aligner, TextDelta(0, "lo wo")) == [(b"Hello", 0), (b" wo", 5)]


@pytest.mark.parametrize("release_at_end", [False, True])
def test_tokens_swallowed_by_a_stop_string_are_dropped(release_at_end: bool) -> None:
    aligner = LogprobAligner(release_at_end=release_at_end)
    released(aligner, tok(b"Hi"))
    released(aligner, TextDelta(0, "Hi"))
    released(aligner, tok(b" wor"))
    released(aligner, tok(b"ld"))
    assert released(aligner, TextDelta(0, " ")) == []
    assert released(aligner, Finished(0, "stop", 3)) == []
    assert released(aligner, TextDelta(0, "later")) == []


def test_choices_are_aligned_separately() -> None:
    aligner = LogprobAligner()
    released(aligner, tok(b"a", 0))
    released(aligner, tok(b"bb", 1))
    assert released(aligner, TextDelta(1, "bb")) == [(b"bb", 0)]
    assert released(aligner, TextDelta(0, "a")) == [(b"a", 0)]


def test_entries_keep_the_engine_event() -> None:
    event = TokenLogprob(0, b"x", -0.25, ((b"x", -0.25), (b"y", -2.0)))
    aligner = LogprobAligner()
    aligner.feed(event)
    assert aligner.feed(TextDelta(0, "x")) == [AlignedLogprob(event, 0)]


def test_a_last_token_without_text_is_released_at_the_end_when_asked() -> None:
    """An end-of-generation token has no text: legacy completions list it (lm-eval reads the
    generated token's entry last), chat does not."""
    for release_at_end, expected in ((False, []), (True, [(b"", 2)])):
        aligner = LogprobAligner(release_at_end=release_at_end)
        released(aligner, tok(b"Hi"))
        assert released(aligner, TextDelta(0, "Hi")) == [(b"Hi", 0)]
        assert released(aligner, tok(b"")) == []
        assert released(aligner, Finished(0, "stop", 2)) == expected
