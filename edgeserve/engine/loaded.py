"""What the engine thread works with once the model is loaded, made in one piece."""

from __future__ import annotations

import logging
from dataclasses import dataclass

from edgeserve.engine.delivery import Outbox
from edgeserve.engine.draft_model import DraftModel, catch_up_tokens
from edgeserve.engine.jobs import AnyJob
from edgeserve.engine.policy import Scheduler
from edgeserve.engine.ports import Backend
from edgeserve.engine.prompt_disk import PromptFiles
from edgeserve.engine.prompt_store import PromptStore
from edgeserve.engine.scoring import LogSoftmax
from edgeserve.engine.step_clock import StepClock
from edgeserve.engine.types import EngineConfig
from edgeserve.errors import EngineError, EngineFault

log = logging.getLogger("edgeserve.engine")


@dataclass
class Tally:
    """The engine thread's running counts (published in `EngineStats`)."""

    steps: int = 0  # decodes run (generation, scoring and embeddings)
    restarts: int = 0  # contexts made anew after a broken decode or a failed invariant
    drafted: int = 0  # tokens drafted by speculation, verified so far
    draft_accepted: int = 0  # drafted tokens that were the answer's


def prompt_store(backend: Backend, config: EngineConfig) -> PromptStore:
    """The prompt cache's tiers below the KV cache, as configured (the disk tier's entries
    of this model, context and cache type read in)."""
    disk = None
    if config.prompt_cache_dir:
        disk = PromptFiles(
            config.prompt_cache_dir, backend.cache_identity, config.prompt_cache_disk
        )
    return PromptStore(config.prompt_cache_ram, disk)


class Loaded:
    """The backend, its scheduler, the log-softmax of log-probs, the outbox of the step's
    events and the running counts. Belongs to the engine thread."""

    def __init__(self, backend: Backend, config: EngineConfig) -> None:
        draft = backend.draft_context
        self.backend = backend
        self.scheduler = Scheduler(
            backend,
            n_ctx=backend.n_ctx,
            n_seq=backend.n_seq,
            prefill_chunk=config.prefill_chunk,
            draft_max=config.draft_max,
            draft_model=(
                DraftModel(draft, catch_up_tokens(config.prefill_chunk)) if draft else None
            ),
            offloaded=backend.n_gpu_layers > 0,
            store=prompt_store(backend, config),
        )
        self.softmax = LogSoftmax(backend.n_vocab)
        self.outbox = Outbox()
        self.tally = Tally()
        self.clock = StepClock()

    def emit(self, job: AnyJob, event: object) -> None:
        """Queue an event for `job`'s request (delivered at the end of the step)."""
        self.outbox.emit(job, event)

    def fail(self, job: AnyJob, exc: Exception) -> None:
        """End one job with an error (EngineFault, logged, for anything but an EngineError);
        the others go on."""
        if isinstance(exc, EngineError):
            error = exc
        else:
            log.error("request %d failed", job.rid, exc_info=exc)
            error = EngineFault(f"request {job.rid} failed: {type(exc).__name__}")
        self.scheduler.cancel(job)
        self.emit(job, error)
