"""The engine's own timings of an answer, on FakeBackend with a clock the test moves one
second per step: `Finished.prompt_s` runs from the job's admission to the step that read its
prompt's last chunk, `decode_s` from then to the step that ended the choice (what Ollama's
`prompt_eval_duration` and `eval_duration` report)."""

from __future__ import annotations

import time

from edgeserve.engine import generating
from edgeserve.engine.jobs import JobState
from edgeserve.engine.types import Finished
from tests.unit.test_engine_fake_backend import Harness


def test_finished_times_the_prompt_s_reading_and_the_answer_s_decoding(monkeypatch):
    clock = [0.0]
    monkeypatch.setattr(generating.time, "perf_counter", lambda: clock[0])
    harness = Harness(parallel=1, draft_max=0)
    job, events = harness.submit("the quick brown fox jumps over the lazy dog", max_tokens=5)
    admitted = read = None
    while not any(isinstance(e, Finished) for e in events):
        clock[0] += 1.0
        harness.step()
        if admitted is None and job.state is not JobState.QUEUED:
            admitted = clock[0]
        if read is None and job.state is not JobState.PREFILLING:
            read = clock[0]
    [end] = [e for e in events if isinstance(e, Finished)]
    assert admitted is not None and read is not None
    assert end.prompt_s == read - admitted >= 1
    assert end.decode_s == clock[0] - read == end.completion_tokens - 1 == 4
    monkeypatch.setattr(generating.time, "perf_counter", time.perf_counter)
    harness.run_until_idle()
