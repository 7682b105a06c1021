"""The scheduler's invariants (policy.py), checked after every step in tests and when the
engine thread fails: each sequence id is owned by at most one live choice or is free, never
both; every stored sequence is contiguous from position 0 (with a sliding window, from no later
than the window's start) and ends where its owner's next token goes; no ended job is in a live
collection; the reservations add up; no window checkpoint lies past what its sequence holds;
each draft model sequence holds what it recorded."""

from __future__ import annotations

from typing import TYPE_CHECKING

from edgeserve.engine.jobs import JobState

if TYPE_CHECKING:
    from edgeserve.engine.policy import Scheduler


class InvariantError(AssertionError):
    """The scheduler's bookkeeping disagrees with itself or with the KV cache."""


def check_scheduler(scheduler: Scheduler) -> None:
    """Raise InvariantError unless every invariant (see the module docstring) holds."""
    s = scheduler
    owners: dict[int, tuple[int, int]] = {}
    for job in s.active:
        _expect(
            job.state in (JobState.PREFILLING, JobState.GENERATING) and not job.finished,
            f"job {job.rid} is active in state {job.state.value}",
        )
        for choice in job.choices:
            if choice.done:
                continue
            seq = choice.seq_id
            _expect(seq not in owners, f"sequence {seq} has two owners")
            _expect(seq not in s.slots, f"sequence {seq} is owned and free")
            owners[seq] = (job.rid, choice.index)
            _expect_cells(s, seq, choice.n_past, f"job {job.rid} choice {choice.index}")
        if job.state is JobState.PREFILLING:
            _expect(job.lead.n_past == job.prefilled, f"job {job.rid} lead is not at its prefill")
    for seq in range(s.n_seq):
        if seq in s.slots:
            _expect_cells(s, seq, len(s.slots.held(seq)), "free")
        else:
            _expect(seq in owners, f"sequence {seq} is neither owned nor free")
    for job in s.waiting:
        _expect(job.state is JobState.QUEUED, f"job {job.rid} waits in {job.state.value}")
    for sjob in s.scoring:
        _expect(sjob.state is JobState.GENERATING, f"score job {sjob.rid} is not running")
    reserved = sum(job.prompt.reserve for job in s.active)
    _expect(s.reserved == reserved, f"reserved {s.reserved} != {reserved} live")
    held = {seq: len(s.slots.held(seq)) for seq in s.slots}
    held |= {c.seq_id: c.n_past for job in s.active for c in job.choices if not c.done}
    for seq, length in held.items():
        for checkpoint in s.windows.of(seq):
            _expect(
                checkpoint.position <= length,
                f"sequence {seq} holds {length} positions, has a checkpoint at "
                f"{checkpoint.position}",
            )
    if s.draft_model is not None:
        mismatch = s.draft_model.mismatch()
        _expect(mismatch is None, f"{mismatch}")


def _expect_cells(s: Scheduler, seq: int, n_past: int, who: str) -> None:
    """Check that `seq` holds positions 0 … n_past-1: all of them, or (with a sliding window)
    at least those the window of its next position finds."""
    first, last = s.kv.seq_pos_range(seq)
    if n_past == 0:
        _expect(last < 0, f"sequence {seq} ({who}) should be empty, holds up to {last}")
    else:
        _expect(
            0 <= first <= s.window_start(n_past) and last == n_past - 1,
            f"sequence {seq} ({who}) holds [{first}, {last}], expected [0, {n_past - 1}]",
        )


def _expect(ok: bool, message: str) -> None:
    if not ok:
        raise InvariantError(message)
