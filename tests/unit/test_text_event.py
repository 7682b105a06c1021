"""The fast content chunk (TextEvent) is byte for byte the chunk the models render."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from edgeserve.api.common.openai_render import TextEvent
from edgeserve.api.common.tool_stream import Content
from edgeserve.api.openai_chat.render import ChatRenderer, piece_chunks
from edgeserve.api.openai_completions.render import CompletionsRenderer, completion_chunk

# Any text a token run can decode to (no lone surrogates: the engine's text is UTF-8 decoded).
texts = st.text(st.characters(exclude_categories=("Cs",)), max_size=40)
models = st.text(st.characters(exclude_categories=("Cs",)), min_size=1, max_size=20)


@settings(max_examples=300, deadline=None)
@given(model=models, pieces=st.lists(texts, min_size=1, max_size=3))
def test_a_chat_content_chunk_is_the_rendered_chunk(model: str, pieces: list[str]) -> None:
    renderer = ChatRenderer(model, include_usage=False, logprobs=False)
    content = [Content(text) for text in pieces]
    expected = piece_chunks(renderer._id, model, renderer._created, content)
    assert renderer.pieces(0, content, None) == expected


@settings(max_examples=300, deadline=None)
@given(model=models, text=texts, index=st.integers(0, 3))
def test_a_completion_text_chunk_is_the_rendered_chunk(model: str, text: str, index: int) -> None:
    renderer = CompletionsRenderer(
        model,
        ["lead"],
        4,
        echo=False,
        generates=True,
        include_usage=False,
        logprobs=False,
        echoed=None,
    )
    expected = completion_chunk(renderer._id, model, renderer._created, index, text)
    assert renderer.pieces(index, [Content(text)], None) == [expected]


def test_a_text_event_needs_the_text_once_in_its_chunk() -> None:
    with pytest.raises(ValueError):
        TextEvent(lambda text: b"data: {}\n\n")
    with pytest.raises(ValueError):
        TextEvent(lambda text: f'data: ["{text}", "{text}"]\n\n'.encode())
