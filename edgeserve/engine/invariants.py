"""The scheduler's invariants (policy.py), checked by the engine thread around its steps
(stepper.py says when) and by the tests after theirs: each sequence id is owned by at most one
live choice or is free, never both; every stored sequence is contiguous from position 0 (with
a sliding window, from no later than the window's start) and ends where its owner's next token
goes; no ended job is in a live collection; the reservations add up; no window checkpoint lies
past what its sequence holds; each draft model sequence holds what it recorded."""

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
        if job.state not in (JobState.PREFILLING, JobState.GENERATING) or job.finished:
            _fail(f"job {job.rid} is active in state {job.state.value}")
        for choice in job.choices:
            if choice.done:
                continue
            seq = choice.seq_id
            if seq in owners:
                _fail(f"sequence {seq} has two owners")
            if seq in s.slots:
                _fail(f"sequence {seq} is owned and free")
            owners[seq] = (job.rid, choice.index)
            _expect_cells(s, seq, choice.n_past, owners[seq])
        if job.state is JobState.PREFILLING and job.lead.n_past != job.prefilled:
            _fail(f"job {job.rid} lead is not at its prefill")
    for seq in range(s.n_seq):
        if seq in s.slots:
            _expect_cells(s, seq, len(s.slots.held(seq)), None)
        elif seq not in owners:
            _fail(f"sequence {seq} is neither owned nor free")
    for job in s.waiting:
        if job.state is not JobState.QUEUED:
            _fail(f"job {job.rid} waits in {job.state.value}")
    for sjob in s.scoring:
        if sjob.state is not JobState.GENERATING:
            _fail(f"score job {sjob.rid} is not running")
    reserved = sum(job.prompt.reserve for job in s.active)
    if s.reserved != reserved:
        _fail(f"reserved {s.reserved} != {reserved} live")
    if s.windows:
        held = {seq: len(s.slots.held(seq)) for seq in s.slots}
        held |= {c.seq_id: c.n_past for job in s.active for c in job.choices if not c.done}
        for checkpoint in s.windows:
            length = held.get(checkpoint.seq)
            if length is not None and checkpoint.position > length:
                _fail(
                    f"sequence {checkpoint.seq} holds {length} positions, has a checkpoint "
                    f"at {checkpoint.position}"
                )
    if s.draft_model is not None and (mismatch := s.draft_model.mismatch()) is not None:
        _fail(mismatch)


def _expect_cells(s: Scheduler, seq: int, n_past: int, owner: tuple[int, int] | None) -> None:
    """Check that `seq` holds positions 0 … n_past-1: all of them, or (with a sliding window)
    at least those the window of its next position finds. `owner`: (job, choice), None for a
    free sequence."""
    first, last = s.kv.seq_pos_range(seq)
    if n_past == 0:
        if last >= 0:
            _fail(f"sequence {seq} ({_who(owner)}) should be empty, holds up to {last}")
    elif not (0 <= first <= s.window_start(n_past) and last == n_past - 1):
        _fail(f"sequence {seq} ({_who(owner)}) holds [{first}, {last}], expected [0, {n_past - 1}]")


def _who(owner: tuple[int, int] | None) -> str:
    return "free" if owner is None else f"job {owner[0]} choice {owner[1]}"


def _fail(message: str) -> None:
    """Raise InvariantError (messages are formatted only when an invariant fails: this check
    runs every step)."""
    raise InvariantError(message)
