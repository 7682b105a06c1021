"""The engine: one thread owns the backend (the llama.cpp model and context) and runs the
scheduler's steps; `Engine` is its facade for every other thread.

- Preparation happens before a request reaches the thread: rendering the chat template,
  tokenizing and checking a grammar (prepare.py) run on a small pool of prepare threads
  (`prepare_async`), so a 100,000-message conversation or an 8 MiB score body never holds the
  engine thread.
- `submit` and `cancel` (any thread) only append to the inbox (inbox.py); the thread takes
  both at the start of each step (stepper.py). With no live work it waits on the inbox: it
  never spins. An idle engine that gets a request while others are still being prepared
  waits until requests stop arriving (`BURST_WINDOW_S` without one, at most `BURST_MOST_S`)
  so a burst shares its first step; a lone request starts at once.
  Idle housekeeping (freeing the scoring and embeddings contexts, handing the logit rows'
  pages back) runs outside the inbox's lock.
- Grammar-constrained sampling runs on grammar threads (generating.py), so a slow grammar
  delays only its own answer.
- Results reach each request's event loop with one `call_soon_threadsafe` per loop per step
  (delivery.py).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import replace
from typing import Any, TypeVar

from edgeserve.engine.adapters import Adapter, AdapterCatalog
from edgeserve.engine.inbox import Inbox
from edgeserve.engine.jobs import AnyJob, EmbedJob, Job, Prompt, ScoreJob, Sink
from edgeserve.engine.llama.backend import LlamaBackend
from edgeserve.engine.planning import decode_limits
from edgeserve.engine.policy import Scheduler
from edgeserve.engine.ports import Backend
from edgeserve.engine.prepare import (
    known_tokens,
    prepare_embed,
    prepare_generation,
    prepare_score,
)
from edgeserve.engine.scoring import TextState
from edgeserve.engine.stepper import Stepper
from edgeserve.engine.types import (
    EmbedRequest,
    EngineConfig,
    EngineStats,
    GenerationRequest,
    MediaKind,
    ScoreRequest,
    Tokenization,
    TokenizerInfo,
)
from edgeserve.errors import EngineFault, EngineLoading, EngineStopped, RequestTooLarge

log = logging.getLogger("edgeserve.engine")

# The scoring and embeddings contexts are freed after this long without a decode in them.
SCORE_CONTEXT_IDLE_S = 30.0
# The generation context's logit rows (a MiB each on a 262k vocabulary, up to one per sequence
# and drafted token) go back to the system after this long without a step.
OUTPUT_PAGES_IDLE_S = 0.5
# Its compute buffer (the pages of the largest step it ran: rows, a micro-batch's activations)
# and the C heap's free pages go back after this long without a step: the next step faults in
# the pages it touches again (~1,600 for a short chat request, ~7 ms on a VM), which a server
# answering a conversation should not pay after every pause.
COMPUTE_PAGES_IDLE_S = 30.0
# The requests of a burst reach an idle engine a few ms apart (each parsed, rendered and
# tokenized in turn): it waits until none has moved on its way in for BURST_WINDOW_S, and at
# most BURST_MOST_S, so that their prompts share the first step instead of the late ones
# prefilling a share of each step beside the early ones (which then finish, and send their
# next requests, steps apart).
BURST_WINDOW_S = 0.01
BURST_MOST_S = 0.1
# Threads that render and tokenize prompts before they reach the engine thread.
PREPARE_THREADS = 2
# Threads that run grammar-constrained sampling (see llama/sampling.py), off the engine thread.
GRAMMAR_THREADS = 2

BackendFactory = Callable[[EngineConfig], Backend]
T = TypeVar("T")


def llama_backend(config: EngineConfig) -> Backend:
    """The llama.cpp backend, sized for what the scheduler will hand it."""
    return LlamaBackend(config, decode_limits(config))


class Engine:
    """Owns the engine thread. `prepare_async`, `submit`, `cancel` and `stats` are safe to call
    from any thread; the backend is made (the model loaded) on the thread itself."""

    def __init__(
        self, config: EngineConfig, backend_factory: BackendFactory = llama_backend
    ) -> None:
        self.config = config
        self.load_error: BaseException | None = None
        self._factory = backend_factory
        self._inbox = Inbox(config.max_queue)
        self.adapters = AdapterCatalog()  # the LoRA adapters loaded over the model
        self._stepper: Stepper | None = None  # made once, when the model has loaded
        self._loaded = threading.Event()
        self._unloaded = EngineStats(
            loaded=False,
            n_ctx=config.n_ctx,
            parallel=config.parallel,
            busy_slots=0,
            queue_length=0,
            gpu_offload=False,
            n_gpu_layers=0,
            draft_model=config.draft_model_path,
        )
        self._step_started: float | None = None
        self._last_step = 0.0  # time.monotonic() at the end of the last step
        self._prepare = ThreadPoolExecutor(PREPARE_THREADS, thread_name_prefix="edgeserve-prep")
        self._grammar = ThreadPoolExecutor(GRAMMAR_THREADS, thread_name_prefix="edgeserve-grammar")
        self._thread = threading.Thread(target=self._run, name="edgeserve-engine", daemon=True)

    # ---- life (any thread) ------------------------------------------------------------------

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
        return self._loaded.is_set() and self._stepper is not None

    @property
    def can_generate(self) -> bool:
        """False for rank-pooling (classifier / reranker) models; True until one is loaded."""
        return self._stepper is None or not self._stepper.state.backend.is_classifier

    @property
    def media_kinds(self) -> frozenset[MediaKind]:
        """What media the loaded model takes besides text (through --mmproj); none before it
        is loaded."""
        return frozenset() if self._stepper is None else self._stepper.state.backend.media_kinds

    @property
    def native_thread_id(self) -> int | None:
        """The engine thread's id as the OS knows it (for /proc/self/task/<id>/stat)."""
        return self._thread.native_id

    @property
    def running(self) -> bool:
        """Whether the engine thread is alive (started and not ended)."""
        return self._thread.is_alive()

    def wait_stopped(self) -> None:
        """Block until the engine thread has ended (after close, a failed load, or a crash)."""
        self._thread.join()

    def stop_accepting(self) -> None:
        """Refuse new requests; admitted ones run to completion."""
        self._inbox.stop_accepting()

    def close(self, timeout: float = 30.0) -> None:
        """Stop the thread (failing whatever is left) and free the model."""
        self._inbox.stop()
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

    # ---- counters (any thread) --------------------------------------------------------------

    def stats(self) -> EngineStats:
        """A snapshot for /health and /metrics: what the thread published after its last
        step, with the queue as it is now."""
        published = self._stepper.snapshot if self._stepper is not None else self._unloaded
        return replace(
            published, queue_length=self._inbox.waiting, draining=not self._inbox.accepting
        )

    @property
    def steps(self) -> int:
        """Decodes run so far (generation, scoring and embeddings)."""
        return self.stats().engine_steps

    # ---- the model (any thread) -------------------------------------------------------------

    def _ready(self) -> Stepper:
        if self._stepper is None:
            raise EngineLoading("the model is not loaded yet")
        return self._stepper

    @property
    def backend(self) -> Backend:
        """The loaded backend (EngineLoading before)."""
        return self._ready().state.backend

    @property
    def scheduler(self) -> Scheduler:
        """The loaded engine's scheduler (EngineLoading before); the engine thread's own."""
        return self._ready().state.scheduler

    @property
    def embedding_size(self) -> int:
        """The length of an embedding vector (EngineLoading before the model is loaded)."""
        return self.backend.embedder.n_embd

    def tokenize(self, request: Tokenization) -> list[int]:
        """The model's tokens for a text; any thread."""
        return self.backend.tokenize(
            request.text, add_special=request.add_special, parse_special=request.parse_special
        )

    def detokenize(self, tokens: tuple[int, ...], *, special: bool) -> str:
        """The text of `tokens` (UnknownToken for an id outside the vocabulary); any thread."""
        backend = self.backend
        return backend.detokenize(known_tokens(backend.n_vocab, tokens), special=special)

    def tokenizer_info(self) -> TokenizerInfo:
        """The loaded model's tokenizer description (EngineLoading before it is loaded)."""
        return self.backend.tokenizer_info

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
        self._inbox.begin_prepare()
        try:
            future = self._prepare.submit(fn, *args)
        except RuntimeError:  # the pool was shut down by close()
            self._inbox.end_prepare()
            raise EngineStopped("the engine is not accepting requests") from None
        # Done, failed or cancelled before it ran (its client went away): the place is free.
        future.add_done_callback(self._inbox.end_prepare)
        return future

    def prepare(self, request: GenerationRequest) -> Prompt:
        """Render, bound, tokenize and size a generation (see prepare.py); any thread."""
        return prepare_generation(self.backend, self.config, request)

    def prepare_score(self, request: ScoreRequest) -> list[TextState]:
        """Tokenize a score request's texts (see prepare.py); any thread."""
        return prepare_score(self.backend, self.config, request)

    def prepare_embed(self, request: EmbedRequest) -> list[list[int]]:
        """Tokenize the texts of an embeddings request (see prepare.py); any thread."""
        return prepare_embed(self.backend, self.config, request)

    # ---- submission (any thread) ------------------------------------------------------------

    def submit(self, request: GenerationRequest, prompt: Prompt, sink: Sink) -> Job:
        """Queue a prepared generation; events go to `sink`."""
        if request.n > self.config.parallel:
            raise RequestTooLarge("n", request.n, self.config.parallel)
        job = Job(rid=0, request=request, prompt=prompt, sink=sink)
        self._inbox.put(job)
        return job

    def submit_score(self, request: ScoreRequest, texts: list[TextState], sink: Sink) -> ScoreJob:
        """Queue a prepared score request; its ScoreResult (or an EngineError) goes to `sink`."""
        job = ScoreJob(rid=0, request=request, texts=texts, sink=sink)
        self._inbox.put(job)
        return job

    def submit_embed(self, request: EmbedRequest, texts: list[list[int]], sink: Sink) -> EmbedJob:
        """Queue a tokenized embeddings request; its EmbedResult (or an EngineError) goes to
        `sink`."""
        whole_texts = self.backend.embedder.whole_texts
        job = EmbedJob(rid=0, request=request, texts=texts, sink=sink, whole_texts=whole_texts)
        self._inbox.put(job)
        return job

    def load_adapter(self, name: str, path: str) -> Future[Adapter]:
        """Load a LoRA adapter as `name` on the engine thread, between steps: a Future of it
        (AdapterRefused: see Stepper.load_adapter)."""
        stepper = self._ready()
        return self._inbox.call(lambda: stepper.load_adapter(name, path))

    def unload_adapter(self, name: str) -> Future[Adapter]:
        """Unload the adapter `name` on the engine thread, between steps: a Future of it
        (UnknownAdapter, or AdapterInUse while a live request runs under it)."""
        stepper = self._ready()
        return self._inbox.call(lambda: stepper.unload_adapter(name))

    def cancel(self, job: AnyJob) -> None:
        """Abort a request: it ends, and its sequences are freed, at the start of the next
        step. No event is sent for it."""
        self._inbox.cancel(job)

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
        for name, path in self.config.lora_adapters:
            self.adapters.add(name, path)  # ids in order, as the backend loaded them
        self._stepper = Stepper(backend, self.config, self._inbox, self._grammar, self.adapters)
        self._loaded.set()
        return True

    def step(self) -> None:
        """One scheduling step (stepper.py); tests call it directly."""
        self._ready().step()

    def housekeeping(self) -> None:
        """While idle (the thread calls it outside the inbox's lock): free the scoring and
        embeddings contexts once unused for SCORE_CONTEXT_IDLE_S, hand the generation
        context's logit rows back to the system OUTPUT_PAGES_IDLE_S after the last step, its
        compute buffer and the heap's free pages COMPUTE_PAGES_IDLE_S after it, and write what
        free sequences hold to the prompt cache's disk tier (should the process die; memory
        takes its copy only when the cells are given to another request); then a slice of the
        backend's idle work, the inbox looked at between slices."""
        stepper = self._ready()
        backend = stepper.state.backend
        now = time.monotonic()
        if self._score_context_due(stepper, now) == 0.0:
            backend.release_score_context()
        if self._output_pages_due(stepper, now) == 0.0:
            backend.release_output_pages()
        if stepper.state.scheduler.unstored():
            stepper.state.scheduler.spill_free()
            stepper.publish()
        if self._compute_pages_due(stepper, now) == 0.0:
            backend.release_compute_pages()
        if backend.idle_work_left:
            backend.idle_work()

    def _housekeeping_due(self, stepper: Stepper) -> float | None:
        """Seconds until idle housekeeping is due (None: nothing to do)."""
        now = time.monotonic()
        dues = [
            self._score_context_due(stepper, now),
            self._output_pages_due(stepper, now),
            self._compute_pages_due(stepper, now),
            0.0 if stepper.state.scheduler.unstored() else None,
            0.0 if stepper.state.backend.idle_work_left else None,
        ]
        return min((due for due in dues if due is not None), default=None)

    def _score_context_due(self, stepper: Stepper, now: float) -> float | None:
        if not stepper.state.backend.holds_score_context:
            return None
        return max(0.0, stepper.scoring.idle_since + SCORE_CONTEXT_IDLE_S - now)

    def _output_pages_due(self, stepper: Stepper, now: float) -> float | None:
        if not stepper.state.backend.holds_output_pages:
            return None
        return max(0.0, self._last_step + OUTPUT_PAGES_IDLE_S - now)

    def _compute_pages_due(self, stepper: Stepper, now: float) -> float | None:
        if not stepper.state.backend.holds_compute_pages:
            return None
        return max(0.0, self._last_step + COMPUTE_PAGES_IDLE_S - now)

    def _run(self) -> None:
        if not self.load():
            return
        stepper = self._ready()
        scheduler = stepper.state.scheduler
        crashed = False
        try:
            while self._wait_for_work(stepper):
                self._step_started = time.monotonic()
                stepper.step()
                self._step_started = None
                self._last_step = time.monotonic()
        except Exception:
            crashed = True
            log.exception("engine thread crashed")
            stepper.fail_all(EngineFault("the engine stopped after an internal error"))
        finally:
            stepper.fail_all(EngineStopped("the server is shutting down"))
            if scheduler.store.disk is not None and not crashed:
                scheduler.spill_free()  # what the KV cache holds outlives the process
            scheduler.store.close()
            # A prepare thread may be tokenizing and a grammar thread sampling with the model:
            # it is freed once they are done (llama.cpp reading freed memory would abort the
            # process), and they take nothing new.
            self._prepare.shutdown(wait=True, cancel_futures=True)
            self._grammar.shutdown(wait=True, cancel_futures=True)
            stepper.state.backend.close()

    def _wait_for_work(self, stepper: Stepper) -> bool:
        """Block until there is something to do; False when the thread should exit."""
        was_idle = stepper.idle()
        work = self._inbox.wait_for(
            stepper.has_work, lambda: self._housekeeping_due(stepper), self.housekeeping
        )
        if work and was_idle:
            self._inbox.linger(BURST_WINDOW_S, BURST_MOST_S)
        generating = stepper.generating
        if work and (deadline := generating.gather_deadline()) is not None:
            self._inbox.hold(lambda: not generating.in_flight(), deadline)
        return work
