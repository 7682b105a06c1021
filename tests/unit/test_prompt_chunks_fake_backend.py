"""How a prompt alone in the engine is cut into decodes (planning.py): its last tokens
(Prompt.tail) in a decode of their own, every chunk before them a multiple of the backend's
`row_multiple` long, a chunk that the batch's room cuts ending on a multiple of CHUNK_ALIGN;
the same prompt found in the prefix cache decodes the same last tokens again, in one decode.
On the scripted FakeBackend."""

from __future__ import annotations

import pytest

from edgeserve.engine.jobs import prompt_tail
from edgeserve.engine.ports import CHUNK_ALIGN
from tests.unit.test_engine_fake_backend import Harness, answers, fresh_answer

LETTERS = "abcdefghijklmnopqrstuvwxyz"


def text(length: int, offset: int = 0) -> str:
    """`length` letters (the fake's tokens: one each, after the BOS)."""
    return "".join(LETTERS[(offset + i * 7) % 26] for i in range(length))


def prompt_chunks(h: Harness, seq: int, n_prompt: int, since: int = 0) -> list[tuple[int, int]]:
    """(first position, tokens) of each decode of `seq`'s prompt positions, from decode
    `since` on."""
    chunks = []
    for decode in h.backend.decodes[since:]:
        positions = [pos for _, pos, s, _ in decode if s == seq and pos < n_prompt]
        if positions:
            chunks.append((positions[0], len(positions)))
    return chunks


@pytest.mark.parametrize("multiple", [1, 2, 4, 8, 16])
def test_a_prompts_tail_leaves_the_rest_a_multiple_of_the_backends_rows(multiple: int):
    for n_prompt in range(1, 300):
        tail = prompt_tail(n_prompt, multiple)
        assert 1 <= tail <= min(multiple, n_prompt)
        assert (n_prompt - tail) % multiple == 0


@pytest.mark.parametrize("multiple", [1, 2, 4])
@pytest.mark.parametrize("length", [60, 61, 62, 63, 130, 131])
def test_a_prompt_alone_ends_in_its_tail_and_from_the_cache_decodes_that_tail_again(
    multiple: int, length: int
):
    h = Harness(parallel=2, n_ctx=512, n_batch=64)
    h.backend.row_multiple = multiple
    first, events = h.submit(text(length), max_tokens=4)
    h.run_until_idle()
    n_prompt = length + 1  # the BOS
    tail = prompt_tail(n_prompt, multiple)
    chunks = prompt_chunks(h, first.lead.seq_id, n_prompt)
    assert chunks[-1] == (n_prompt - tail, tail)
    assert sum(size for _, size in chunks) == n_prompt
    assert all(size % multiple == 0 and size <= 64 for _, size in chunks[:-1])
    assert answers(events) == fresh_answer(text(length), max_tokens=4)

    since = len(h.backend.decodes)
    again, repeated = h.submit(text(length), max_tokens=4)
    h.run_until_idle()
    assert again.cached == n_prompt - tail
    assert prompt_chunks(h, again.lead.seq_id, n_prompt, since) == [(n_prompt - tail, tail)]
    assert answers(repeated) == answers(events)
    h.assert_clean()


def test_after_a_prefix_cache_hit_a_chunk_the_room_cuts_ends_on_chunk_align():
    # The second prompt shares 38 positions with the first (the BOS and 37 letters), then
    # goes on for 150 more: its first chunk stops at 64, not at 38 + 64, and the ones after
    # start on multiples of CHUNK_ALIGN.
    h = Harness(parallel=1, n_ctx=512, n_batch=64)
    h.backend.row_multiple = 2
    h.submit(text(37) + text(20, offset=3), max_tokens=2)
    h.run_until_idle()
    since = len(h.backend.decodes)
    second, events = h.submit(text(37) + text(150, offset=5), max_tokens=2)
    h.run_until_idle()
    assert second.cached == 38
    n_prompt = 1 + 37 + 150
    chunks = prompt_chunks(h, second.lead.seq_id, n_prompt, since)
    assert chunks[0] == (38, CHUNK_ALIGN - 38)
    assert [start % CHUNK_ALIGN for start, _ in chunks[1:-1]] == [0] * (len(chunks) - 2)
    assert answers(events) == fresh_answer(text(37) + text(150, offset=5), max_tokens=2)
    h.assert_clean()


def test_beside_a_running_stream_the_last_prompt_token_is_not_held_back():
    # With another answer being generated, the decode's rows are not the prompt's alone:
    # its chunks take what the step's budget gives, the last one ending the prompt.
    h = Harness(parallel=2, n_ctx=512, n_batch=64)
    h.backend.row_multiple = 4
    h.submit(text(10), max_tokens=40)
    h.step(3)
    second, events = h.submit(text(30, offset=1), max_tokens=3)
    h.run_until_idle()
    chunks = prompt_chunks(h, second.lead.seq_id, 31)
    assert sum(size for _, size in chunks) == 31
    assert chunks[-1][1] > prompt_tail(31, 4)
    assert answers(events) == fresh_answer(text(30, offset=1), max_tokens=3)
    h.assert_clean()


@pytest.mark.parametrize(
    ("document", "question", "marks"),
    [(83, "which one", (84,)), (84, "which one", (86,)), (20, "which one", ()), (100, "q", ())],
)
def test_a_line_mark_keeps_to_the_backends_rows_and_none_comes_before_min_tokens(
    document: int, question: str, marks: tuple[int, ...]
):
    # The question's line starts after the BOS, the document and the line break: moved back
    # to an even position under row_multiple 2, and dropped when it would give back fewer
    # than MIN_TOKENS (64) positions, or where the prompt's last tokens start (a one-letter
    # line: the checkpoint before them is taken anyway).
    h = Harness(window=8, parallel=1, n_ctx=256)
    h.backend.row_multiple = 2
    job, _ = h.submit(f"{text(document)}\n{question}", max_tokens=2)
    h.run_until_idle()
    assert job.prompt.marks == marks
    h.assert_clean()


def test_beside_a_stream_a_prompt_found_in_the_cache_goes_before_a_longer_one():
    # A stream runs and a long prompt is prefilling within the step's share when a prompt
    # found whole in the prefix cache arrives: its tail takes the next step's budget first,
    # where it would otherwise wait for the long prompt's chunks.
    h = Harness(parallel=3, n_ctx=512, n_batch=64, prompt_cache_ram=2**24)
    stream, _ = h.submit(text(10), max_tokens=120)
    h.step()
    first, _ = h.submit(text(70, offset=9), max_tokens=2)
    while not first.state.ended:
        h.step()
    long, _ = h.submit(text(120, offset=4), max_tokens=2)
    h.step()
    assert 0 < long.prefilled < 100
    cached, events = h.submit(text(70, offset=9), max_tokens=2)
    h.step()
    assert cached.cached == 70
    assert answers(events) != [""]
    assert not stream.state.ended
    h.run_until_idle()
    assert answers(events) == fresh_answer(text(70, offset=9), max_tokens=2)
    h.assert_clean()
