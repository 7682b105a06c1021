"""Speculative decoding with a draft model: a small model with the target's vocabulary drafts
each sequence's next tokens (greedy), verified exactly as n-gram drafts are (speculation.py).

The draft model has a context of its own with one sequence per target sequence (same ids).
Its KV cache follows the target lazily: `held` records the tokens each draft sequence holds,
and before a sequence drafts, the cells past its common prefix with the sequence's history
(prompt and answer so far) are removed and the missing tokens decoded, all sequences in one
decode of at most `catch_up` tokens per step (a sequence still behind after it drafts nothing
this step). The row of a history's last token gives the first draft token; each further
token is one decode of the sequences still drafting, one position each. The target keeps
what it verifies, and the draft cells it rejects go at the next sync.

How many tokens a sequence drafts is decided as for n-gram drafts (`DraftPace`), with the
draft model's own cost added to the threshold: a drafted position takes one more draft decode
(`position_s`, measured), so a draft model whose decode costs a large share of the target's
step drafts only probes (the default model drafting for itself on a CPU does). The draft
model is asked once per step for all sequences, before the step's batch is written. A draft
context with no room drops the cells of sequences not drafting and tries once more; a broken
or failing draft context is cleared and the step goes on without drafts: drafting never
fails a request.

Pure bookkeeping over a `DraftContext` (ports.py; the llama.cpp one is
`llama/draft_model.LlamaDraftContext`), so unit tests run it on a scripted fake.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass

from edgeserve.engine.ports import DraftContext
from edgeserve.engine.slots import common_prefix

log = logging.getLogger("edgeserve.engine")

# Weight left to earlier decodes at each measured draft decode (recent ones count most).
COST_MEMORY = 0.9
# The fewest tokens the draft sequences catch up by per step (see `catch_up_tokens`).
MIN_CATCH_UP = 64


@dataclass(frozen=True)
class DraftWant:
    """Sequence `seq`, whose tokens so far are `history`, drafts up to `k` tokens."""

    seq: int
    history: list[int]
    k: int


def catch_up_tokens(prefill_chunk: int) -> int:
    """Tokens the draft sequences may catch up by per step: --prefill-chunk, at least
    MIN_CATCH_UP (a draft model is small beside its target, and a long prompt should not
    wait dozens of steps for its first draft)."""
    return max(prefill_chunk, MIN_CATCH_UP)


def batch_size(prefill_chunk: int, n_seq: int) -> int:
    """Tokens one draft decode may hold: a catch-up step, or one token per sequence."""
    return max(catch_up_tokens(prefill_chunk), n_seq)


class DraftModel:
    """Drafts from a `DraftContext`, keeping its sequences in step with the target's."""

    def __init__(self, context: DraftContext, catch_up: int) -> None:
        self.context = context
        self.catch_up = max(1, catch_up)
        # The tokens whose KV each draft sequence holds (positions 0 … len-1).
        self.held: dict[int, list[int]] = {seq: [] for seq in range(context.n_seq)}
        # Seconds one drafted position takes (a decode of one token per drafting sequence),
        # None until measured.
        self.position_s: float | None = None

    def step_share(self, step_s: float | None) -> float:
        """The share of a target step taking `step_s` seconds (`StepCost.generation_seconds`)
        that one drafted position costs here; 0 until both are measured."""
        if step_s is None or self.position_s is None or step_s <= 0.0:
            return 0.0
        return self.position_s / step_s

    def clear(self) -> None:
        """Forget every draft sequence (after the target context was made anew)."""
        self.context.clear()
        self.held = {seq: [] for seq in self.held}

    def mismatch(self) -> str | None:
        """The first draft sequence whose cells are not positions 0 … len(held)-1, described
        (None when every one matches its record): a check of this bookkeeping."""
        for seq, held in self.held.items():
            stored = self.context.seq_pos_range(seq)
            expected = (0, len(held) - 1) if held else (-1, -1)
            if stored != expected:
                return f"draft sequence {seq} holds {stored}, expected {expected}"
        return None

    def draft(self, wants: Sequence[DraftWant]) -> list[list[int]]:
        """Each want's draft, in order: up to `k` greedy tokens of the draft model after
        its history; fewer or none when its catch-up is not done or the context fails."""
        drafts: list[list[int]] = [[] for _ in wants]
        try:
            rows = self._catch_up(wants)
            for i, row in rows.items():
                drafts[i].append(self.context.greedy(row))
            self._extend(wants, drafts, [i for i in rows if wants[i].k > 1])
        except Exception:
            log.exception("the draft model failed; this step goes on without its drafts")
            self.clear()
            return [[] for _ in wants]
        return drafts

    def _catch_up(self, wants: Sequence[DraftWant]) -> dict[int, int]:
        """Trim each wanting sequence to its common prefix with its history and decode what
        it lacks, fewest missing tokens first, within `catch_up` tokens. Returns the batch
        row of each want whose history is now whole (its first draft token's row)."""
        batch = self.context.batch
        batch.clear()
        order = []
        for i, want in enumerate(wants):
            if want.k > 0:
                # The history's last token is always decoded again, for its row.
                keep = min(common_prefix(self.held[want.seq], want.history), len(want.history) - 1)
                order.append((len(want.history) - keep, keep, i))
        order.sort()
        budget = self.catch_up
        rows: dict[int, int] = {}
        caught: dict[int, list[int]] = {}
        for missing, keep, i in order:
            take = min(missing, budget)
            if take <= 0:
                break
            want = wants[i]
            self.context.seq_rm(want.seq, keep, -1)
            self.held[want.seq] = want.history[:keep]
            whole = take == missing
            start = batch.add_span(
                want.history[keep : keep + take], keep, want.seq, (take - 1,) if whole else ()
            )
            if whole:
                rows[i] = start + take - 1
            caught[want.seq] = want.history[: keep + take]
            budget -= take
        if not caught or not self._decode(set(caught)):
            return {}
        self.held.update(caught)
        return rows

    def _extend(self, wants: Sequence[DraftWant], drafts: list[list[int]], live: list[int]) -> None:
        """Decode each live want's latest draft token and append the next, one position per
        decode for all of them, until each has `k` (or a decode fails)."""
        batch = self.context.batch
        while live:
            batch.clear()
            rows = [
                batch.add(drafts[i][-1], len(self.held[wants[i].seq]), wants[i].seq, True)
                for i in live
            ]
            started = time.perf_counter()
            if not self._decode({wants[i].seq for i in live}):
                return
            self._measured(time.perf_counter() - started)
            for i, row in zip(live, rows, strict=True):
                self.held[wants[i].seq].append(drafts[i][-1])
                drafts[i].append(self.context.greedy(row))
            live = [i for i in live if len(drafts[i]) < wants[i].k]

    def _measured(self, seconds: float) -> None:
        previous = self.position_s
        self.position_s = (
            seconds if previous is None else COST_MEMORY * previous + (1 - COST_MEMORY) * seconds
        )

    def _decode(self, drafting: set[int]) -> bool:
        """Decode the batch; on no room, drop the cells of the sequences not in `drafting`
        and try once more. A broken context is cleared. True when the batch was decoded."""
        rc = self.context.decode()
        if rc == 1 and self._drop_others(drafting):
            rc = self.context.decode()
        if rc not in (0, 1):
            log.warning("the draft model's decode returned %s; its context is cleared", rc)
            self.clear()
        return rc == 0

    def _drop_others(self, drafting: set[int]) -> bool:
        """Empty the draft sequences not in `drafting`; False when none held anything."""
        dropped = False
        for seq, held in self.held.items():
            if seq not in drafting and held:
                self.context.seq_rm(seq, -1, -1)
                self.held[seq] = []
                dropped = True
        return dropped
