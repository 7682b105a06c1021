"""Sliding-window checkpoints (checkpoints.py): the bookkeeping alone, then the scheduler on
the scripted FakeBackend with window-sized caches (a decode drops every position a window left
behind; decoding a position whose window misses cells is refused)."""

from __future__ import annotations

import numpy as np
import pytest

from edgeserve.engine.checkpoints import MAX_PER_SEQUENCE, WindowCheckpoints
from edgeserve.engine.jobs import Choice, Job, JobState, MediaSpan, Prompt
from edgeserve.engine.planning import GenerationPlan, Planner
from edgeserve.engine.types import (
    ChatPrompt,
    ChatTurn,
    GenerationRequest,
    SamplingParams,
    TokenPrompt,
)
from tests.unit.fake_backend import FakeBatch
from tests.unit.test_engine_fake_backend import Harness, answers, fresh_answer

WINDOW = 8
SHARED = "a shared beginning then "  # 24 letters and spaces: with the BOS, 25 tokens


def letters(h: Harness, text: str) -> list[int]:
    """`text`'s tokens, no BOS."""
    return h.backend.tokenize(text, add_special=False, parse_special=False)


# ---- the bookkeeping --------------------------------------------------------------------------


def test_checkpoints_are_due_at_each_spacing_and_before_the_last_prompt_tokens_once():
    windows = WindowCheckpoints(budget=1000, n_swa=WINDOW)
    due = [p for p in range(0, 30) if windows.due(0, p, tail_start=26)]
    assert due == [8, 16, 24, 26]
    assert [p for p in range(0, 30) if windows.due(0, p, tail_start=25)] == [8, 16, 24, 25]
    windows.add(0, 16, "state")
    assert not windows.due(0, 16, tail_start=26)
    assert windows.due(1, 16, tail_start=26)  # another sequence's position


@pytest.mark.parametrize("tail_start", [8, 9, 63, 64, 65, 71, 72, 73, 100, 130])
@pytest.mark.parametrize("marks", [(), (30,), (66,), (30, 67)])
def test_no_checkpoint_is_taken_that_the_same_prompt_would_push_out(
    tail_start: int, marks: tuple[int, ...]
):
    # Taking every due one in order, as a prompt's prefill does, keeps exactly the
    # positions that MAX_PER_SEQUENCE lets survive: none is copied only to be dropped.
    windows = WindowCheckpoints(budget=10_000, n_swa=WINDOW)
    planned = [
        p for p in range(1, tail_start + 1) if p % WINDOW == 0 or p == tail_start or p in marks
    ]
    taken = []
    for position in range(tail_start + 1):
        if windows.due(0, position, tail_start, marks):
            windows.add(0, position, "state")
            taken.append(position)
    assert taken == planned[-MAX_PER_SEQUENCE:]
    assert [c.position for c in windows.of(0)] == taken


def test_no_checkpoints_without_a_window_or_room_for_one():
    assert not WindowCheckpoints(budget=1000, n_swa=0).enabled
    assert not WindowCheckpoints(budget=WINDOW - 1, n_swa=WINDOW).enabled
    assert WindowCheckpoints(budget=WINDOW, n_swa=WINDOW).spacing == WINDOW
    assert WindowCheckpoints(budget=0, n_swa=WINDOW).spacing == 0


def test_the_budget_and_the_cap_drop_the_oldest_first():
    windows = WindowCheckpoints(budget=3 * WINDOW, n_swa=WINDOW)
    for position in (8, 16, 24, 32):
        windows.add(position % 2, position, position)
    assert [c.position for c in windows.of(0)] == [16, 24, 32]  # 8 went for the budget
    assert windows.cells == 3 * WINDOW  # a window each (llama.cpp's copy holds n_swa cells)
    windows.add(1, 3, "short")  # a checkpoint before position 3 holds 3 cells
    assert windows.cells == 2 * WINDOW + 3
    many = WindowCheckpoints(budget=10_000, n_swa=WINDOW)
    for position in range(1, MAX_PER_SEQUENCE + 3):
        many.add(5, position * WINDOW, position)
    assert [c.state for c in many.of(5)] == list(range(3, MAX_PER_SEQUENCE + 3))


def test_the_best_checkpoint_is_the_latest_at_or_before_the_prefix_and_cuts_drop_later_ones():
    windows = WindowCheckpoints(budget=1000, n_swa=WINDOW)
    for position in (8, 16, 24):
        windows.add(2, position, position)
    assert windows.best(2, 23).position == 16
    assert windows.best(2, 24).position == 24
    assert windows.best(2, 7) is None
    assert windows.best(3, 24) is None
    windows.trimmed(2, 16)
    assert [c.position for c in windows.of(2)] == [8, 16]
    windows.trimmed(2, -1)
    assert windows.of(2) == [] and windows.cells == 0


# ---- the scheduler with window-sized caches ---------------------------------------------------


def test_a_shared_prefix_whose_window_is_gone_is_reused_from_a_checkpoint():
    h = Harness(window=WINDOW, parallel=2)
    first, _ = h.submit(SHARED + "one", max_tokens=20)
    h.run_until_idle()
    # 28 prompt tokens and 19 decoded answer tokens: the sliding layers kept only the window
    # of the last position decoded, 39-46.
    assert h.backend.seq_pos_range(first.lead.seq_id) == (39, 46)
    second, events = h.submit(SHARED + "two", max_tokens=6)
    h.run_until_idle()
    assert second.cached == 24  # the checkpoint before position 24 (25 tokens are shared)
    assert h.backend.windows_restored == 1
    assert answers(events) == fresh_answer(SHARED + "two", max_tokens=6)
    h.assert_clean()


def test_a_checkpoint_past_what_its_sequence_holds_breaks_the_context():
    h = Harness(window=WINDOW, parallel=2)
    first, _ = h.submit(SHARED + "one", max_tokens=20)
    h.run_until_idle()
    seq = first.lead.seq_id
    held = len(h.scheduler.slots.held(seq))
    h.scheduler.windows.trimmed(seq, -1)
    h.scheduler.windows.add(seq, held + 1, b"")  # a window the sequence never reached
    h.step()
    assert h.engine.stats().engine_restarts == 1


def test_without_checkpoints_such_a_prefix_is_decoded_again():
    h = Harness(window=WINDOW, budget=0, parallel=2)
    h.submit(SHARED + "one", max_tokens=20)
    h.run_until_idle()
    second, events = h.submit(SHARED + "two", max_tokens=6)
    h.run_until_idle()
    assert second.cached == 0
    assert answers(events) == fresh_answer(SHARED + "two", max_tokens=6)
    h.assert_clean()


@pytest.mark.parametrize(
    ("kept", "then", "cached", "restored"),
    [
        # The next turn re-sends the whole answer: its window is still there.
        (47, "and more", 47, 0),
        # The last three answer tokens differ: back to the checkpoint before the first
        # prompt's last token.
        (44, "xyz", 27, 1),
    ],
)
def test_the_next_turn_goes_on_from_the_answer_or_from_the_prompts_checkpoint(
    kept: int, then: str, cached: int, restored: int
):
    h = Harness(window=WINDOW, parallel=2)
    first, _ = h.submit(SHARED + "one", max_tokens=20)
    h.run_until_idle()
    held = h.scheduler.slots.held(first.lead.seq_id)
    assert len(held) == 28 + 19
    follow_up = TokenPrompt((*held[:kept], *letters(h, then)))
    second, events = h.submit(follow_up, max_tokens=6)
    h.run_until_idle()
    assert second.cached == cached
    assert h.backend.windows_restored == restored
    assert answers(events) == fresh_answer(follow_up, max_tokens=6)
    h.assert_clean()


def test_prompt_chunks_end_where_checkpoints_go():
    h = Harness(window=WINDOW, parallel=2)
    h.submit(SHARED + "one", max_tokens=2)
    h.run_until_idle()
    prefill_ends = [decode[-1][1] + 1 for decode in h.backend.decodes[:5]]
    assert prefill_ends == [8, 16, 24, 27, 28]
    h.assert_clean()


def test_choices_of_one_prompt_and_drafts_keep_every_window_they_decode_with():
    # n=3 copies the lead's window to its siblings; a repetitive prompt makes n-gram drafts,
    # whose rejected cells are cut. The fake refuses any decode whose window misses a cell.
    h = Harness(window=WINDOW, parallel=4)
    _, events = h.submit("abcabcabcabcabcabcabcabc", n=3, temperature=1.0, seed=3, max_tokens=12)
    _, repeat = h.submit("xyzxyzxyzxyzxyzxyzxyz", max_tokens=16)
    h.run_until_idle()
    assert answers(events, 3) == fresh_answer(
        "abcabcabcabcabcabcabcabc", n=3, temperature=1.0, seed=3, max_tokens=12
    )
    assert answers(repeat) == fresh_answer("xyzxyzxyzxyzxyzxyzxyz", max_tokens=16)
    h.assert_clean()


def test_a_checkpoint_cut_away_is_never_restored():
    # The second request keeps 24 positions of the first's sequence (from its checkpoint):
    # the first's checkpoint before 27 goes with the rest, and the second prompt takes its
    # own there. A third request sharing the second's prompt goes on from that one.
    h = Harness(window=WINDOW, parallel=1)
    h.submit(SHARED + "one", max_tokens=20)
    h.run_until_idle()
    second, _ = h.submit(SHARED + "ozz", max_tokens=20)
    h.run_until_idle()
    assert second.cached == 24
    third, events = h.submit(SHARED + "ozz" + "y" * 5, max_tokens=6)
    h.run_until_idle()
    assert third.cached == 27
    assert answers(events) == fresh_answer(SHARED + "ozz" + "y" * 5, max_tokens=6)
    h.assert_clean()


def test_the_short_question_after_an_image_is_one_chunk_across_a_checkpoint_position():
    # An image at 100-499, then 60 tokens of question: decoded in one chunk, as llama.cpp's
    # own chunk evaluation does, although a checkpoint position (512) falls inside it. Text
    # alone at the same place stops at 512.
    def first_chunk(media: tuple[MediaSpan, ...]) -> int:
        prompt = Prompt(tokens=list(range(560)), max_new=4, reserve=564, media=media)
        job = Job(1, GenerationRequest(TokenPrompt(()), SamplingParams()), prompt, sink=None)
        job.state, job.prefilled = JobState.PREFILLING, 500
        job.choices = [Choice(0, seq_id=0, sampler=None, stops=())]  # type: ignore[arg-type]
        planner = Planner(
            n_ctx=4096, prefill_chunk=16, draft_max=0, draft_model=None, checkpoint_spacing=512
        )
        plan = planner.plan(FakeBatch(2048), [job], [])
        assert isinstance(plan, GenerationPlan)
        return plan.prefills[0][1]

    image = MediaSpan(100, np.zeros((400, 4), dtype=np.float32), non_causal=True)
    assert first_chunk((image,)) == 60
    assert first_chunk(()) == 12


@pytest.mark.parametrize("stored", [False, True])
def test_a_checkpoint_where_the_last_message_starts_keeps_the_earlier_ones_for_another(
    stored: bool,
):
    # The same 83-letter document, then another question: the window of the question's start
    # is gone, and the checkpoint taken where the last message starts gives all of the
    # document back (the one at a multiple of the window only its first 80 positions), from
    # the KV cache or, once other prompts took the cells, from the store.
    h = Harness(window=WINDOW, parallel=1, n_ctx=256, prompt_cache_ram=(1 << 20) * stored)
    document = "abcdefghij" * 8 + "klm"

    def conversation(question: str) -> ChatPrompt:
        return ChatPrompt((ChatTurn("user", document), ChatTurn("user", question)))

    first, _ = h.submit(conversation("one"), max_tokens=4)
    h.run_until_idle()
    assert first.prompt.marks == (1 + len(document),)  # after the BOS and the document
    if stored:
        h.submit("another prompt " * 6, max_tokens=4)  # takes the only sequence's cells
        h.run_until_idle()
    second, events = h.submit(conversation("two"), max_tokens=4)
    h.run_until_idle()
    assert second.cached == 1 + len(document)
    assert answers(events) == fresh_answer(conversation("two"), max_tokens=4)
    h.assert_clean()


@pytest.mark.parametrize("stored", [False, True])
@pytest.mark.parametrize("chat", [False, True])
def test_a_checkpoint_where_the_last_line_starts_gives_the_document_back_for_another_question(
    stored: bool, chat: bool
):
    # One message (or raw text): an 83-letter document, a line break, a question. Another
    # question after the same document goes on from the checkpoint where the question's line
    # starts (the latest multiple of the window would give back only 80 positions).
    h = Harness(window=WINDOW, parallel=1, n_ctx=256, prompt_cache_ram=(1 << 20) * stored)
    document = "abcdefghij" * 8 + "klm"
    line_start = 1 + len(document) + 1  # after the BOS, the document and the line break

    def asking(question: str) -> ChatPrompt | str:
        text = f"{document}\n{question}"
        return ChatPrompt((ChatTurn("user", text),)) if chat else text

    first, _ = h.submit(asking("which one"), max_tokens=4)
    h.run_until_idle()
    assert first.prompt.marks == (line_start,)
    if stored:
        h.submit("another prompt " * 6, max_tokens=4)  # takes the only sequence's cells
        h.run_until_idle()
    second, events = h.submit(asking("and the other"), max_tokens=4)
    h.run_until_idle()
    assert second.cached == line_start
    assert answers(events) == fresh_answer(asking("and the other"), max_tokens=4)
    h.assert_clean()


@pytest.mark.parametrize(
    "text",
    ["a single line", "a line\n", "a line\n   \n", "x" * 40 + "\nq"],
)
def test_no_line_mark_without_an_earlier_line_or_too_near_the_end(text: str):
    # A line mark needs a line before the last one, and text on the last line; a mark on the
    # prompt's last token (here: a one-letter line) is the checkpoint taken there anyway.
    h = Harness(window=WINDOW, parallel=1, n_ctx=256)
    job, _ = h.submit(text, max_tokens=2)
    h.run_until_idle()
    assert job.prompt.marks == ()
