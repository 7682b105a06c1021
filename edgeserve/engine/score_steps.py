"""Score and embeddings steps on the engine thread, each in a context of its own (see
policy.py): one chunk of one text, or one embeddings decode, per step."""

from __future__ import annotations

import time

from edgeserve.engine.loaded import Loaded
from edgeserve.engine.planning import EmbedPlan, ScorePlan


class ScoreSteps:
    """Runs score and embeddings plans; `idle_since` is when the last of them ended."""

    def __init__(self, state: Loaded) -> None:
        self.state = state
        self.backend = state.backend
        self.scheduler = state.scheduler
        self.idle_since = 0.0

    def score(self, plan: ScorePlan) -> None:
        """Decode a score chunk; the job's result goes out once its last text is scored."""
        job = plan.job
        try:
            self._score_chunk(plan)
        except Exception as exc:
            self.state.fail(job, exc)
            return
        finally:
            self.idle_since = time.monotonic()
        if job.current_text() is None:
            self.scheduler.finish_score(job)
            self.state.emit(job, job.result(self.backend.piece))

    def _score_chunk(self, plan: ScorePlan) -> None:
        backend = self.backend
        text = plan.text
        if not text.tokens:
            return
        self.state.tally.steps += 1
        if text.classify:
            text.logprobs.append(backend.classify(text.tokens))
            text.fed = len(text.tokens)
            return
        rows = backend.score_chunk(
            text.tokens[plan.start : plan.start + plan.take], plan.start, plan.outputs
        )
        softmax = self.state.softmax
        top_n = plan.job.request.top_logprobs
        for off, row in zip(plan.outputs, rows, strict=True):
            position = plan.start + off + 1
            target = text.tokens[position]
            if top_n is None:
                text.logprobs.append(softmax.logprob(row, target))
            else:
                detail = softmax.describe(row, position, target, top_n, backend.piece)
                text.details.append(detail)
                text.logprobs.append(detail.logprob)
        text.fed = plan.start + plan.take

    def embed(self, plan: EmbedPlan) -> None:
        """Decode the plan's spans; the job's result goes out once every text has its
        vector."""
        job = plan.job
        self.state.tally.steps += 1
        try:
            job.record(plan.spans, self.backend.embedder.embed(plan.spans))
        except Exception as exc:
            self.state.fail(job, exc)
            return
        finally:
            self.idle_since = time.monotonic()
        if job.done:
            self.scheduler.finish_score(job)
            self.state.emit(job, job.result())
