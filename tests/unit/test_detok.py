"""UTF-8 reassembly and stop-string hold-back."""

from __future__ import annotations

import pytest

from edgeserve.engine.detok import StopMatcher, Utf8Assembler


def test_multibyte_character_split_across_pieces():
    asm = Utf8Assembler()
    data = "héllo 😀!".encode()
    out = "".join(asm.feed(data[i : i + 1]) for i in range(len(data))) + asm.flush()
    assert out == "héllo 😀!"


def test_unfinished_character_is_held_then_replaced_at_the_end():
    asm = Utf8Assembler()
    assert asm.feed("😀".encode()[:2]) == ""
    assert asm.flush() == "\ufffd"


def test_invalid_bytes_become_replacement_characters():
    asm = Utf8Assembler()
    assert asm.feed(b"a\xffb") == "a\ufffdb"


def run(stops: tuple[str, ...], pieces: list[str]) -> tuple[str, str | None]:
    matcher = StopMatcher(stops)
    out = []
    for piece in pieces:
        text, hit = matcher.push(piece)
        out.append(text)
        if hit is not None:
            return "".join(out), hit
    return "".join(out) + matcher.flush(), None


@pytest.mark.parametrize(
    ("stops", "pieces", "expected", "hit"),
    [
        ((), ["a", "b"], "ab", None),
        (("END",), ["hello ", "E", "N", "D", " more"], "hello ", "END"),
        (("END",), ["hello E", "ND"], "hello ", "END"),
        (("END",), ["hello EN", "d"], "hello ENd", None),
        (("END",), ["xEN"], "xEN", None),
        (("ab", "b"), ["xab"], "x", "ab"),
        (("b", "ab"), ["xab"], "x", "ab"),
        (("ab", "xa"), ["xab"], "", "xa"),
        (("\n\n",), ["line\n", "\nnext"], "line", "\n\n"),
        (("",), ["keep"], "keep", None),
    ],
)
def test_stop_matcher(stops, pieces, expected, hit):
    assert run(stops, pieces) == (expected, hit)


def test_partial_match_is_held_back_until_resolved():
    matcher = StopMatcher(("STOP",))
    assert matcher.push("abc ST") == ("abc ", None)
    assert matcher.push("O") == ("", None)
    assert matcher.push("x") == ("STOx", None)
