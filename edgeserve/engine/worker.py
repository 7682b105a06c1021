"""The engine thread: takes requests in, runs the scheduler's steps, delivers results.

One thread owns the backend (the llama.cpp model and context). Around it:

- Preparation happens before a request reaches the thread: rendering the chat template,
  tokenizing and checking a grammar (prepare.py) run on a small pool of prepare threads
  (`prepare_async`), so a 100,000-message conversation or an 8 MiB score body never holds the
  engine thread.
- `submit` and `cancel` (any thread) only append to the inbox under one lock; the thread takes
  both at the start of each step. With no live work it waits on that lock's condition: it
  never spins. An idle engine that gets a request waits `BURST_WINDOW_S` so a burst shares its
  first step. Idle housekeeping (freeing the scoring and embeddings contexts) runs outside
  the lock.
- Grammar-constrained sampling runs on grammar threads from a copy of the logit row (see
  sampling.py): the choice sits out the steps until its token arrives, and the other streams
  go on, so a slow grammar delays only its own answer.
- Isolation: any exception while serving one job (sampling, a grammar, a score chunk, making
  its samplers) ends that job alone with EngineFault (500, logged with its traceback); the
  others go on. A decode that breaks the context (any status but 0 or 1) or a scheduler
  invariant that stops holding makes the context anew: the running jobs get EngineRestarted
  (503, retry), the waiting ones stay queued, and the process keeps serving.
- Results reach each request's event loop with one `call_soon_threadsafe` per loop per step.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np

from edgeserve.engine.backend import Backend, LlamaBackend
from edgeserve.engine.draft_model import DraftModel, catch_up_tokens
from edgeserve.engine.jobs import AnyJob, Choice, EmbedJob, Job, Prompt, ScoreJob, Sink
from edgeserve.engine.policy import (
    EmbedPlan,
    GenerationPlan,
    InvariantError,
    Scheduler,
    ScorePlan,
)
from edgeserve.engine.prepare import (
    known_tokens,
    prepare_embed,
    prepare_generation,
    prepare_score,
)
from edgeserve.engine.scoring import LogSoftmax, TextState
from edgeserve.engine.types import (
    EmbedRequest,
    EngineConfig,
    EngineStats,
    Finished,
    FinishReason,
    GenerationRequest,
    ScoreRequest,
    TextDelta,
    Tokenization,
    TokenizerInfo,
    TokenLogprob,
)
from edgeserve.errors import (
    EngineError,
    EngineFault,
    EngineOverloaded,
    EngineRestarted,
    EngineStopped,
    RequestTooLarge,
)

log = logging.getLogger("edgeserve.engine")

# The scoring and embeddings contexts are freed after this long without a decode in them.
SCORE_CONTEXT_IDLE_S = 30.0
# The requests of a burst reach an idle engine a few ms apart; it waits this long after the
# first so that their prompts share the first step instead of queueing behind one prefill.
BURST_WINDOW_S = 0.01
# Threads that render and tokenize prompts before they reach the engine thread.
PREPARE_THREADS = 2
# Threads that run grammar-constrained sampling (see sampling.py), off the engine thread.
GRAMMAR_THREADS = 2

BackendFactory = Callable[[EngineConfig], Backend]
T = TypeVar("T")


@dataclass(frozen=True)
class _Counters:
    """What the engine thread publishes after each step for `stats()` (read lock-free)."""

    busy_slots: int = 0
    scoring_jobs: int = 0
    kv_cells_used: int = 0
    prefix_cache_cells: int = 0
    prefix_cache_hits: int = 0
    prefix_cached_tokens: int = 0
    step_fixed_seconds: float = 0.0
    step_row_seconds: float = 0.0
    step_prompt_token_seconds: float = 0.0


class Engine:
    """Owns the engine thread. `prepare_async`, `submit`, `cancel` and `stats` are safe to call
    from any thread; the backend is made (the model loaded) on the thread itself."""

    def __init__(
        self, config: EngineConfig, backend_factory: BackendFactory = LlamaBackend
    ) -> None:
        self.config = config
        self.backend: Backend | None = None
        self.scheduler: Scheduler | None = None
        self.load_error: BaseException | None = None
        self._factory = backend_factory
        self._cond = threading.Condition()
        self._inbox: deque[AnyJob] = deque()
        self._cancels: deque[AnyJob] = deque()
        self._queued = 0  # jobs in the scheduler's waiting queue (kept under _cond)
        self._preparing = 0  # requests on the prepare threads (kept under _cond)
        self._accepting = True
        self._running = True
        self._loaded = threading.Event()
        self._next_id = 0
        self._outbox: dict[Any, list[tuple[Callable[[Any], None], Any]]] = {}
        self._softmax: LogSoftmax | None = None
        self._score_idle_since = 0.0
        self._counters = _Counters()
        self.steps = 0  # decodes run (generation and scoring)
        self.restarts = 0  # contexts made anew after a broken decode or a failed invariant
        self.drafted = 0  # tokens drafted by speculation, verified so far
        self.draft_accepted = 0  # drafted tokens that were the answer's
        self._step_started: float | None = None
        self._prepare = ThreadPoolExecutor(PREPARE_THREADS, thread_name_prefix="edgeserve-prep")
        self._grammar = ThreadPoolExecutor(GRAMMAR_THREADS, thread_name_prefix="edgeserve-grammar")
        self._thread = threading.Thread(target=self._run, name="edgeserve-engine", daemon=True)

    # ---- control (any thread) ---------------------------------------------------------------

    def start(self) -> None:
        """Start the engine thread; the model loads there (see `wait_loaded`)."""
        self._thread.start()

    def wait_loaded(self, timeout: float | None = None) -> bool:
        """Block until the model loaded or failed; True when it is ready."""
        self._loaded.wait(timeout)
        return self.loaded

    @property
    def loaded(self) -> bool:
        """True once the model is ready to serve."""
        return self._loaded.is_set() and self.backend is not None

    @property
    def can_generate(self) -> bool:
        """False for rank-pooling (classifier / reranker) models; True until one is loaded."""
        return self.backend is None or not self.backend.is_classifier

    @property
    def native_thread_id(self) -> int | None:
        """The engine thread's id as the OS knows it (for /proc/self/task/<id>/stat)."""
        return self._thread.native_id

    def wait_stopped(self) -> None:
        """Block until the engine thread has ended (after close, a failed load, or a crash)."""
        self._thread.join()

    def stop_accepting(self) -> None:
        """Refuse new requests; admitted ones run to completion."""
        with self._cond:
            self._accepting = False

    def close(self, timeout: float = 30.0) -> None:
        """Stop the thread (failing whatever is left) and free the model."""
        with self._cond:
            self._accepting = False
            self._running = False
            self._cond.notify()
        self._prepare.shutdown(wait=False, cancel_futures=True)
        self._grammar.shutdown(wait=False, cancel_futures=True)
        if self._thread.is_alive():
            self._thread.join(timeout)

    def stalled_for(self) -> float:
        """Seconds the thread has spent inside its current step (0 between steps): a thread
        stuck in llama.cpp shows here. Waiting for work, or for a grammar thread's sample,
        is not a stall."""
        started = self._step_started
        return 0.0 if started is None else max(0.0, time.monotonic() - started)

    def stats(self) -> EngineStats:
        """A snapshot for /health and /metrics."""
        backend = self.backend
        counters = self._counters
        with self._cond:
            queued = self._preparing + len(self._inbox) + self._queued
        return EngineStats(
            loaded=self.loaded,
            n_ctx=backend.n_ctx if backend else self.config.n_ctx,
            parallel=self.config.parallel,
            busy_slots=counters.busy_slots,
            scoring_jobs=counters.scoring_jobs,
            queue_length=queued,
            gpu_offload=backend.gpu_offload if backend else False,
            n_gpu_layers=backend.n_gpu_layers if backend else 0,
            kv_cells_used=counters.kv_cells_used,
            draining=not self._accepting,
            prefix_cache_hits=counters.prefix_cache_hits,
            prefix_cached_tokens=counters.prefix_cached_tokens,
            prefix_cache_cells=counters.prefix_cache_cells,
            engine_steps=self.steps,
            engine_restarts=self.restarts,
            draft_tokens=self.drafted,
            draft_accepted_tokens=self.draft_accepted,
            draft_model=self.config.draft_model_path,
            step_fixed_seconds=counters.step_fixed_seconds,
            step_row_seconds=counters.step_row_seconds,
            step_prompt_token_seconds=counters.step_prompt_token_seconds,
        )

    # ---- preparation (prepare threads) ------------------------------------------------------

    def prepare_async(
        self, request: GenerationRequest | ScoreRequest | EmbedRequest
    ) -> Future[Any]:
        """Render and tokenize on a prepare thread: a Future of the `Prompt` (generation),
        the texts' states (score) or tokens (embeddings), or of the EngineError that refuses
        the request. The request holds a queue place meanwhile (EngineOverloaded when there
        is none)."""
        if isinstance(request, GenerationRequest):
            return self.on_prepare_thread(self.prepare, request)
        if isinstance(request, EmbedRequest):
            return self.on_prepare_thread(self.prepare_embed, request)
        return self.on_prepare_thread(self.prepare_score, request)

    def on_prepare_thread(self, fn: Callable[..., T], *args: Any) -> Future[T]:
        """`fn(*args)` on a prepare thread, holding a queue place meanwhile (EngineOverloaded
        when there is none, EngineStopped once closed)."""
        with self._cond:
            self._check_room()
            self._preparing += 1
        try:
            future = self._prepare.submit(fn, *args)
        except RuntimeError:  # the pool was shut down by close()
            self._prepared(None)
            raise EngineStopped("the engine is not accepting requests") from None
        # Done, failed or cancelled before it ran (its client went away): the place is free.
        future.add_done_callback(self._prepared)
        return future

    def _prepared(self, _future: object) -> None:
        with self._cond:
            self._preparing -= 1

    def _ready_backend(self) -> Backend:
        backend = self.backend
        if backend is None:
            raise EngineStopped("the model is not loaded")
        return backend

    def prepare(self, request: GenerationRequest) -> Prompt:
        """Render, bound, tokenize and size a generation (see prepare.py); any thread."""
        return prepare_generation(self._ready_backend(), self.config, request)

    def prepare_score(self, request: ScoreRequest) -> list[TextState]:
        """Tokenize a score request's texts (see prepare.py); any thread."""
        return prepare_score(self._ready_backend(), self.config, request)

    def prepare_embed(self, request: EmbedRequest) -> list[list[int]]:
        """Tokenize the texts of an embeddings request (see prepare.py); any thread."""
        return prepare_embed(self._ready_backend(), self.config, request)

    @property
    def embedding_size(self) -> int:
        """The length of an embedding vector (EngineStopped before the model is loaded)."""
        return self._ready_backend().embedder.n_embd

    def tokenize(self, request: Tokenization) -> list[int]:
        """The model's tokens for a text; any thread."""
        return self._ready_backend().tokenize(
            request.text, add_special=request.add_special, parse_special=request.parse_special
        )

    def detokenize(self, tokens: tuple[int, ...], *, special: bool) -> str:
        """The text of `tokens` (UnknownToken for an id outside the vocabulary); any thread."""
        backend = self._ready_backend()
        return backend.detokenize(known_tokens(backend.n_vocab, tokens), special=special)

    def tokenizer_info(self) -> TokenizerInfo:
        """The loaded model's tokenizer description (EngineStopped before it is loaded)."""
        return self._ready_backend().tokenizer_info

    # ---- submission (any thread) ------------------------------------------------------------

    def submit(self, request: GenerationRequest, prompt: Prompt, sink: Sink) -> Job:
        """Queue a prepared generation; events go to `sink`."""
        if request.n > self.config.parallel:
            raise RequestTooLarge("n", request.n, self.config.parallel)
        job = Job(rid=0, request=request, prompt=prompt, sink=sink)
        self._enqueue(job)
        return job

    def submit_score(self, request: ScoreRequest, texts: list[TextState], sink: Sink) -> ScoreJob:
        """Queue a prepared score request; its ScoreResult (or an EngineError) goes to `sink`."""
        job = ScoreJob(rid=0, request=request, texts=texts, sink=sink)
        self._enqueue(job)
        return job

    def submit_embed(self, request: EmbedRequest, texts: list[list[int]], sink: Sink) -> EmbedJob:
        """Queue a tokenized embeddings request; its EmbedResult (or an EngineError) goes to
        `sink`."""
        whole_texts = self._ready_backend().embedder.whole_texts
        job = EmbedJob(rid=0, request=request, texts=texts, sink=sink, whole_texts=whole_texts)
        self._enqueue(job)
        return job

    def _check_room(self) -> None:
        """Under _cond: raise unless a new request may queue."""
        if not self._accepting or not self._running:
            raise EngineStopped("the engine is not accepting requests")
        waiting = self._preparing + len(self._inbox) + self._queued
        if waiting >= self.config.max_queue:
            raise EngineOverloaded(f"{waiting} requests are waiting")

    def _enqueue(self, job: AnyJob) -> None:
        with self._cond:
            self._check_room()
            self._next_id += 1
            job.rid = self._next_id
            self._inbox.append(job)
            self._cond.notify()

    def cancel(self, job: AnyJob) -> None:
        """Abort a request: it ends, and its sequences are freed, at the start of the next
        step. No event is sent for it."""
        with self._cond:
            self._cancels.append(job)
            self._cond.notify()

    # ---- the thread -------------------------------------------------------------------------

    def load(self) -> bool:
        """Make the backend (load the model) on the calling thread; False when it failed
        (see `load_error`). The engine thread calls it first; tests of the engine's logic
        call `load` and `step` themselves, with no thread."""
        try:
            backend = self._factory(self.config)
        except Exception as exc:  # reported by the CLI as one line
            self.load_error = exc
            self._loaded.set()
            return False
        draft = backend.draft_context
        self.scheduler = Scheduler(
            backend,
            n_ctx=backend.n_ctx,
            n_seq=backend.n_seq,
            prefill_chunk=self.config.prefill_chunk,
            draft_max=self.config.draft_max,
            draft_model=(
                DraftModel(draft, catch_up_tokens(self.config.prefill_chunk)) if draft else None
            ),
        )
        self._softmax = LogSoftmax(backend.n_vocab)
        self.backend = backend
        self._publish(0)
        self._loaded.set()
        return True

    def _run(self) -> None:
        if not self.load():
            return
        backend = self.backend
        assert backend is not None
        try:
            while self._wait_for_work():
                self._step_started = time.monotonic()
                self.step()
                self._step_started = None
        except Exception:
            log.exception("engine thread crashed")
            self._fail_all(EngineFault("the engine stopped after an internal error"))
        finally:
            self._fail_all(EngineStopped("the server is shutting down"))
            backend.close()

    def _wait_for_work(self) -> bool:
        """Block until there is something to do; False when the thread should exit."""
        scheduler = self.scheduler
        assert scheduler is not None
        was_idle = not scheduler.live_jobs()
        while True:
            with self._cond:
                if not self._running:
                    return False
                if self._inbox or self._cancels or scheduler.has_work() or self._arrivals():
                    break
                self._cond.wait(self._housekeeping_due())
            self._housekeeping()
        if was_idle:
            deadline = time.monotonic() + BURST_WINDOW_S
            with self._cond:
                while self._running and (left := deadline - time.monotonic()) > 0:
                    self._cond.wait(left)
        return True

    def _housekeeping_due(self) -> float | None:
        """Seconds until idle housekeeping is due (None: nothing to do)."""
        backend = self.backend
        if backend is None or not backend.holds_score_context:
            return None
        return max(0.0, self._score_idle_since + SCORE_CONTEXT_IDLE_S - time.monotonic())

    def _housekeeping(self) -> None:
        """While idle and outside the lock: free the scoring context once unused long enough."""
        backend = self.backend
        if backend is not None and self._housekeeping_due() == 0.0:
            backend.release_score_context()

    def step(self) -> None:
        """One scheduling step: take in new requests and cancels, admit, decode once, deliver.
        Never blocks (the thread waits in `_wait_for_work`); tests call it directly."""
        scheduler = self.scheduler
        backend = self.backend
        assert scheduler is not None and backend is not None
        with self._cond:
            inbox, self._inbox = self._inbox, deque()
            cancels, self._cancels = self._cancels, deque()
            self._queued += len(inbox)
        for job in inbox:
            scheduler.enqueue(job)
        for job in cancels:
            scheduler.cancel(job)
        self._collect_samples()
        for job, exc in scheduler.admit(self._open_choices):
            self._fail(job, exc)
        plan = scheduler.plan(backend.batch)
        if isinstance(plan, ScorePlan):
            self._score(plan)
        elif isinstance(plan, EmbedPlan):
            self._embed(plan)
        elif plan is not None:
            self._generate(plan)
        try:
            kv_cells = scheduler.check_invariants()
        except InvariantError as exc:
            self._restart(f"a scheduler invariant failed ({exc})")
            kv_cells = 0  # the new context is empty
        with self._cond:
            self._queued = len(scheduler.waiting)
        self._publish(kv_cells)
        self._flush()

    def _open_choices(self, job: Job, seqs: list[int]) -> list[Choice]:
        """The choices of a job being admitted: one sampler per sequence."""
        backend = self.backend
        assert backend is not None
        params = job.request.params
        choices: list[Choice] = []
        try:
            for index, seq in enumerate(seqs):
                sampler = backend.new_sampler(params, index, job.prompt.gbnf)
                choices.append(Choice(index=index, seq_id=seq, sampler=sampler, stops=params.stop))
        except BaseException:
            for choice in choices:
                choice.sampler.free()
            raise
        return choices

    # ---- generation -------------------------------------------------------------------------

    def _generate(self, plan: GenerationPlan) -> None:
        scheduler = self.scheduler
        backend = self.backend
        assert scheduler is not None and backend is not None
        started = time.perf_counter()
        try:
            rc = backend.decode()
        except Exception as exc:
            log.exception("llama_decode raised")
            rc = f"an exception ({exc})"
        self.steps += 1
        if rc == 1:
            self._relieve_kv()
            return
        if rc != 0:
            self._restart(f"llama_decode returned {rc}")
            return
        scheduler.step_cost.record(
            plan.logit_rows + plan.ending_prompts, time.perf_counter() - started, plan.prompt_tokens
        )
        for row, job, choice, draft in scheduler.commit(plan):
            if job.state.ended or choice.done:
                continue
            try:
                if draft:
                    self._verify(job, choice, row, draft)
                else:
                    self._sample(job, choice, row)
            except Exception as exc:
                self._fail(job, exc)

    def _verify(self, job: Job, choice: Choice, row: int, draft: tuple[int, ...]) -> None:
        """Sample row `row` and the draft's rows after it in order, keeping each drafted token
        only while it is the token sampled before it (speculation.py): the answer is the one
        of sampling one row per step. Cells of rejected drafts go."""
        scheduler = self.scheduler
        assert scheduler is not None
        drafter = choice.drafter
        assert drafter is not None
        drafter.drafted += len(draft)
        self.drafted += len(draft)
        accepted = 0
        for offset in range(len(draft) + 1):
            if offset:
                choice.n_past += 1  # the drafted token before this row is the answer's
            token = choice.sampler.sample(row + offset)
            kept = offset < len(draft) and token == draft[offset]
            if kept:
                accepted += 1
                drafter.accepted += 1
                self.draft_accepted += 1
            self._on_sampled(job, choice, token, row + offset)
            if choice.done or not kept:
                break
        if not choice.done:
            scheduler.keep(choice, len(draft), accepted)

    def _sample(self, job: Job, choice: Choice, row: int) -> None:
        """Sample output row `row` for `choice`: here, or (a grammar) on a grammar thread from
        a copy of the row, the choice sitting out the steps until its token arrives."""
        backend = self.backend
        assert backend is not None
        sampler = choice.sampler
        if not sampler.detached:
            self._on_sampled(job, choice, sampler.sample(row), row)
            return
        logits = backend.logit_row(row).copy()
        future = self._grammar.submit(sampler.sample_logits, logits)
        choice.pending = (future, logits)
        future.add_done_callback(self._wake)

    def _on_sampled(self, job: Job, choice: Choice, token: int | None, row: int) -> None:
        """`_on_token` for a token sampled in place from batch row `row` (read for log-probs
        when asked)."""
        backend = self.backend
        assert backend is not None
        wanted = job.request.params.logprobs is not None
        self._on_token(job, choice, token, backend.logit_row(row) if wanted else None)

    def _wake(self, _future: object) -> None:
        with self._cond:
            self._cond.notify()

    def _arrivals(self) -> list[tuple[Job, Choice]]:
        """The choices whose detached sample has arrived."""
        scheduler = self.scheduler
        assert scheduler is not None
        return [
            (job, choice)
            for job in scheduler.active
            for choice in job.choices
            if choice.pending is not None and choice.pending[0].done()
        ]

    def _collect_samples(self) -> None:
        """Account for the detached samples that have arrived."""
        for job, choice in self._arrivals():
            assert choice.pending is not None
            future, logits = choice.pending
            choice.pending = None
            if job.state.ended or choice.done:
                continue
            try:
                self._on_token(job, choice, future.result(), logits)
            except Exception as exc:
                self._fail(job, exc)

    def _relieve_kv(self) -> None:
        scheduler = self.scheduler
        assert scheduler is not None
        outcome = scheduler.relieve_kv()
        if isinstance(outcome, tuple):
            job, choice = outcome
            log.warning("KV cache full: ending request %d choice %d early", job.rid, choice.index)
            self._finish(job, choice, "length")
        elif outcome is not None:
            log.warning("KV cache full: request %d goes back to the queue", outcome.rid)

    def _on_token(
        self, job: Job, choice: Choice, token: int | None, logits: np.ndarray | None
    ) -> None:
        """Account for a sampled token (`logits`: the row it came from, when log-probs are
        asked): end of generation, stop string, limits, or go on."""
        backend = self.backend
        assert backend is not None
        if token is None:  # the grammar allows nothing more
            self._finish(job, choice, "stop")
            return
        choice.n_gen += 1
        choice.generated.append(token)
        end = backend.is_eog(token)
        top_n = job.request.params.logprobs
        if top_n is not None:
            assert logits is not None
            self._emit(job, self._describe(logits, choice.index, token, top_n))
        if end:
            self._finish(job, choice, "stop")
            return
        text, hit = choice.push_text(backend.piece(token))
        self._emit_text(job, choice, text)
        if hit is not None:
            self._finish(job, choice, "stop", drain=False, stop_sequence=hit)
        elif choice.sampler.slow:
            log.warning(
                "request %d choice %d: a grammar step took over %g s; answer ended early",
                job.rid,
                choice.index,
                choice.sampler.step_limit_s,
            )
            self._finish(job, choice, "length")
        elif choice.n_gen >= job.prompt.max_new or choice.n_past >= backend.n_ctx:
            self._finish(job, choice, "length")
        else:
            choice.last_token = token

    def _describe(self, row: np.ndarray, index: int, token: int, top_n: int) -> TokenLogprob:
        """`token`'s log-probability from a raw logit row, read in place (no copy of the row),
        and the `top_n` most likely tokens."""
        backend = self.backend
        softmax = self._softmax
        assert backend is not None and softmax is not None
        lse = softmax.logsumexp(row)
        top: tuple[tuple[bytes, float], ...] = ()
        if top_n > 0:
            best = np.argpartition(row, -top_n)[-top_n:]
            best = best[np.argsort(row[best])[::-1]]
            top = tuple((backend.piece(int(t)), float(row[t]) - lse) for t in best)
        return TokenLogprob(index, backend.piece(token), float(row[token]) - lse, top)

    def _emit_text(self, job: Job, choice: Choice, text: str) -> None:
        if text:
            self._emit(job, TextDelta(choice.index, text))

    def _finish(
        self,
        job: Job,
        choice: Choice,
        reason: FinishReason,
        *,
        drain: bool = True,
        stop_sequence: str | None = None,
    ) -> None:
        """End a choice: release held-back text, report it, free its sequence."""
        scheduler = self.scheduler
        assert scheduler is not None
        if drain:
            self._emit_text(job, choice, choice.drain_text())
        drafter = choice.drafter
        finished = Finished(
            choice.index,
            reason,
            choice.n_gen,
            job.cached,
            stop_sequence,
            drafter.drafted if drafter else 0,
            drafter.accepted if drafter else 0,
        )
        self._emit(job, finished)
        scheduler.finish(job, choice)

    # ---- scoring ----------------------------------------------------------------------------

    def _score(self, plan: ScorePlan) -> None:
        scheduler = self.scheduler
        backend = self.backend
        assert scheduler is not None and backend is not None
        job = plan.job
        try:
            self._score_chunk(plan)
        except Exception as exc:
            self._fail(job, exc)
            return
        finally:
            self._score_idle_since = time.monotonic()
        if job.current_text() is None:
            scheduler.finish_score(job)
            self._emit(job, job.result(backend.piece))

    def _score_chunk(self, plan: ScorePlan) -> None:
        backend = self.backend
        softmax = self._softmax
        assert backend is not None and softmax is not None
        text = plan.text
        if not text.tokens:
            return
        self.steps += 1
        if text.classify:
            text.logprobs.append(backend.classify(text.tokens))
            text.fed = len(text.tokens)
            return
        rows = backend.score_chunk(
            text.tokens[plan.start : plan.start + plan.take], plan.start, plan.outputs
        )
        top_n = plan.job.request.top_logprobs
        for off, row in zip(plan.outputs, rows, strict=True):
            position = plan.start + off + 1
            target = text.tokens[position]
            if top_n is None:
                text.logprobs.append(softmax.logprob(row, target))
            else:
                detail = self._describe(row, position, target, top_n)
                text.details.append(detail)
                text.logprobs.append(detail.logprob)
        text.fed = plan.start + plan.take

    # ---- embeddings -------------------------------------------------------------------------

    def _embed(self, plan: EmbedPlan) -> None:
        scheduler = self.scheduler
        backend = self.backend
        assert scheduler is not None and backend is not None
        job = plan.job
        self.steps += 1
        try:
            job.record(plan.spans, backend.embedder.embed(plan.spans))
        except Exception as exc:
            self._fail(job, exc)
            return
        finally:
            self._score_idle_since = time.monotonic()
        if job.done:
            scheduler.finish_score(job)
            self._emit(job, job.result())

    # ---- failures ---------------------------------------------------------------------------

    def _fail(self, job: AnyJob, exc: Exception) -> None:
        """End one job with an error; the others go on."""
        scheduler = self.scheduler
        assert scheduler is not None
        if isinstance(exc, EngineError):
            error = exc
        else:
            log.error("request %d failed", job.rid, exc_info=exc)
            error = EngineFault(f"request {job.rid} failed: {type(exc).__name__}")
        scheduler.cancel(job)
        self._emit(job, error)

    def _restart(self, why: str) -> None:
        """Make the generation context anew: running jobs get EngineRestarted, queued ones
        stay. Raises (ending the thread) only when no new context can be made."""
        scheduler = self.scheduler
        backend = self.backend
        assert scheduler is not None and backend is not None
        self.restarts += 1
        log.error("restarting the engine's context: %s", why)
        ended = scheduler.reset()
        backend.reset()
        for job in ended:
            self._emit(job, EngineRestarted("the engine restarted after an internal error"))

    def _fail_all(self, exc: EngineError) -> None:
        with self._cond:
            self._running = False
            leftovers: list[AnyJob] = [*self._inbox]
            self._inbox.clear()
            self._cancels.clear()
            self._queued = 0
        scheduler = self.scheduler
        if scheduler is not None:
            leftovers += scheduler.live_jobs()
            for job in scheduler.live_jobs():
                scheduler.cancel(job)
        for job in leftovers:
            self._emit(job, exc)
        self._publish(self._counters.kv_cells_used)
        self._flush()

    # ---- delivery ---------------------------------------------------------------------------

    def _publish(self, kv_cells: int) -> None:
        """Counters for `stats()`: the scheduler's, and `kv_cells` as the invariant check read
        them from the KV cache itself."""
        scheduler = self.scheduler
        if scheduler is None:
            return
        self._counters = _Counters(
            busy_slots=scheduler.n_seq - len(scheduler.slots),
            scoring_jobs=len(scheduler.scoring),
            kv_cells_used=kv_cells,
            prefix_cache_cells=scheduler.slots.cached_cells,
            prefix_cache_hits=scheduler.prefix_hits,
            prefix_cached_tokens=scheduler.prefix_tokens,
            step_fixed_seconds=scheduler.step_cost.fixed_seconds(),
            step_row_seconds=scheduler.step_cost.row_seconds(),
            step_prompt_token_seconds=scheduler.step_cost.token_seconds() or 0.0,
        )

    def _emit(self, job: AnyJob, event: object) -> None:
        self._outbox.setdefault(job.sink.loop, []).append((job.sink.put, event))

    def _flush(self) -> None:
        outbox, self._outbox = self._outbox, {}
        for loop, items in outbox.items():
            try:
                loop.call_soon_threadsafe(_deliver, items)
            except RuntimeError:
                log.debug("dropping %d events for a closed event loop", len(items))


def _deliver(items: list[tuple[Callable[[Any], None], Any]]) -> None:
    for put, event in items:
        put(event)
