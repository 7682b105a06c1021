"""The engine thread: continuous batching over llama.cpp sequences.

One thread owns the model and context. Each step builds ONE `llama_decode` batch holding the
next token of every generating sequence plus chunks of waiting prompts: up to `n_batch` tokens
while nothing generates, else `prefill_chunk` tokens (times how many waiting prompts there are
per generating request), so a newcomer's prefill delays running streams by ~0.1 s per step
instead of a whole batch. Then it samples each sequence with its own native sampler chain.
Results reach the event loop with one `call_soon_threadsafe` per loop per step.

Admission is FIFO. A request needs `n` free sequence ids and a KV reservation of its prompt
plus `n × min(max_tokens, n_ctx / parallel)` cells; a request alone in the engine is always
admitted. If the unified KV cache still runs out, the longest running choice ends with
`length`.

Score requests share the thread: their texts are decoded one at a time in a separate scoring
context (see `_decode_once`), in chunks that alternate with generation steps (shorter chunks
while streams run), requesting logits only for rows that predict a scored token.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

import llama_cpp as lc
import numpy as np

from edgeserve.engine.batch import TokenBatch
from edgeserve.engine.chat_template import ChatTemplate, resolve_template
from edgeserve.engine.model import SCORE_CHUNK, SCORE_CHUNK_BESIDE_STREAMS, LoadedModel
from edgeserve.engine.sampling import Sampler, grammar_sampler, grammar_text
from edgeserve.engine.scoring import ScoreJob, TextState
from edgeserve.engine.sequence import Choice, Job, Sink
from edgeserve.engine.slots import SlotPool
from edgeserve.engine.types import (
    ChatPrompt,
    EngineConfig,
    EngineStats,
    Finished,
    GenerationRequest,
    PromptInfo,
    ScoreRequest,
    TextDelta,
    TokenLogprob,
)
from edgeserve.errors import (
    EngineError,
    EngineOverloaded,
    EngineStopped,
    PromptTooLong,
    RequestTooLarge,
)

log = logging.getLogger("edgeserve.engine")

# The scoring context is freed after this long without a score request.
SCORE_CONTEXT_IDLE_S = 30.0
# The requests of a burst reach an idle engine a few ms apart; it waits this long after the
# first so that their prompts share the first step instead of queueing behind one prefill.
BURST_WINDOW_S = 0.01


class Engine:
    """Owns the engine thread. `submit` and `cancel` are safe to call from any thread."""

    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self.model: LoadedModel | None = None
        self.load_error: BaseException | None = None
        self._template: ChatTemplate | None = None
        self._cond = threading.Condition()
        self._inbox: deque[Job | ScoreJob] = deque()
        self._cancels: deque[Job | ScoreJob] = deque()
        self._pending = 0
        self._accepting = True
        self._running = True
        self._loaded = threading.Event()
        self._waiting: deque[Job | ScoreJob] = deque()
        self._active: list[Job] = []
        self._scoring: list[ScoreJob] = []
        self._slots = SlotPool(config.parallel)
        self._prefix_hits = 0
        self._prefix_tokens = 0
        self._reserved = 0
        self._score_turn = True
        self._score_idle_since = 0.0
        self._next_id = 0
        self._outbox: dict[Any, list[tuple[Callable[[Any], None], Any]]] = {}
        self._thread = threading.Thread(target=self._run, name="edgeserve-engine", daemon=True)

    # ---- control (any thread) -------------------------------------------------------------

    def start(self) -> None:
        """Start the engine thread; the model loads there (see `wait_loaded`)."""
        self._thread.start()

    def wait_loaded(self, timeout: float | None = None) -> bool:
        """Block until the model loaded or failed; True when it is ready."""
        self._loaded.wait(timeout)
        return self.model is not None and self.load_error is None

    @property
    def can_generate(self) -> bool:
        """False for rank-pooling (classifier / reranker) models; True until a model is loaded."""
        return self.model is None or not self.model.is_classifier

    @property
    def loaded(self) -> bool:
        """True once the model is ready to serve."""
        return self._loaded.is_set() and self.load_error is None

    def submit(self, request: GenerationRequest, sink: Sink) -> Job:
        """Queue a generation; events go to `sink`. Raises EngineOverloaded / EngineStopped."""
        if request.n > self.config.parallel:
            raise RequestTooLarge("n", request.n, self.config.parallel)
        job = Job(rid=0, request=request, sink=sink)
        self._enqueue(job)
        return job

    def submit_score(self, request: ScoreRequest, sink: Sink) -> ScoreJob:
        """Queue a score request; its ScoreResult (or an EngineError) goes to `sink`."""
        job = ScoreJob(rid=0, request=request, sink=sink)
        self._enqueue(job)
        return job

    def _enqueue(self, job: Job | ScoreJob) -> None:
        with self._cond:
            if not self._accepting or not self._running:
                raise EngineStopped("the engine is not accepting requests")
            if self._pending >= self.config.max_queue:
                raise EngineOverloaded(f"{self._pending} requests are waiting")
            self._next_id += 1
            job.rid = self._next_id
            self._pending += 1
            self._inbox.append(job)
            self._cond.notify()

    def cancel(self, job: Job | ScoreJob) -> None:
        """Abort a request: its sequences are freed at the start of the next step."""
        with self._cond:
            self._cancels.append(job)
            self._cond.notify()

    def _left_queue(self) -> None:
        """A request stopped waiting (admitted, rejected or cancelled)."""
        with self._cond:
            self._pending -= 1

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
        if self._thread.is_alive():
            self._thread.join(timeout)

    def stats(self) -> EngineStats:
        """A snapshot for /health and /metrics (reads plain ints; no locking needed)."""
        model = self.model
        busy = self.config.parallel - len(self._slots)
        return EngineStats(
            loaded=self.loaded,
            n_ctx=model.n_ctx if model else self.config.n_ctx,
            parallel=self.config.parallel,
            busy_slots=busy,
            queue_length=self._pending,
            gpu_offload=model.gpu_offload if model else False,
            n_gpu_layers=model.n_gpu_layers if model else 0,
            kv_cells_used=sum(c.n_past for j in list(self._active) for c in j.choices),
            draining=not self._accepting,
            prefix_cache_hits=self._prefix_hits,
            prefix_cached_tokens=self._prefix_tokens,
        )

    # ---- the thread -----------------------------------------------------------------------

    def _run(self) -> None:
        try:
            self.model = LoadedModel(self.config)
            source = resolve_template(
                self.config.chat_template, self.model.chat_template, self.model.architecture
            )
            self._template = ChatTemplate(
                source,
                bos_token=self.model.token_text(self.model.bos),
                eos_token=self.model.token_text(lc.llama_vocab_eos(self.model.vocab)),
            )
        except Exception as exc:  # reported by the CLI as one line
            self.load_error = exc
            if self.model is not None:
                self.model.close()
                self.model = None
            self._loaded.set()
            return
        self._loaded.set()
        model = self.model
        batch = TokenBatch(model.n_ctx if model.is_classifier else self.config.n_batch)
        try:
            while self._step(batch):
                pass
        except Exception:
            log.exception("engine thread crashed")
            self._fail_all(EngineError("the engine stopped after an internal error"))
        finally:
            self._fail_all(EngineStopped("the server is shutting down"))
            batch.free()
            self.model.close()

    def _step(self, batch: TokenBatch) -> bool:
        """One scheduling step; returns False when the thread should exit."""
        with self._cond:
            idle = not self._active and not self._scoring
            while (
                self._running
                and not self._inbox
                and not self._cancels
                and not self._active
                and not self._scoring
                and not (self._waiting and self._can_admit(self._waiting[0]))
            ):
                self._cond.wait(self._idle_housekeeping())
            if idle and self._inbox and self._running:
                deadline = time.monotonic() + BURST_WINDOW_S
                while (left := deadline - time.monotonic()) > 0:
                    self._cond.wait(left)
            if not self._running:
                return False
            inbox, self._inbox = self._inbox, deque()
            cancels, self._cancels = self._cancels, deque()
        for job in inbox:
            self._accept(job)
        for job in cancels:
            self._abort(job)
        self._admit()
        if self._active or self._scoring:
            self._decode_once(batch)
        self._flush()
        return True

    def _idle_housekeeping(self) -> float | None:
        """While idle: free the scoring context once it has gone unused for
        SCORE_CONTEXT_IDLE_S. Returns how long to wait before looking again (None: until
        woken)."""
        model = self.model
        assert model is not None
        if not model.holds_score_context:
            return None
        left = self._score_idle_since + SCORE_CONTEXT_IDLE_S - time.monotonic()
        if left > 0:
            return left
        model.release_score_context()
        return None

    def _accept(self, job: Job | ScoreJob) -> None:
        """Tokenize a new request and check that it can ever fit; then it waits for a slot."""
        model = self.model
        assert model is not None and self._template is not None
        if isinstance(job, ScoreJob):
            self._accept_score(job)
            return
        try:
            job.tokens = self._tokenize(job.request.prompt)
            spec = job.request.params.grammar
            if spec is not None:
                job.gbnf = grammar_text(spec)
                lc.llama_sampler_free(grammar_sampler(model.vocab, job.gbnf))
        except EngineError as exc:
            self._reject(job, exc)
            return
        n_prompt = len(job.tokens)
        if n_prompt >= model.n_ctx:
            self._reject(job, PromptTooLong(n_prompt, model.n_ctx))
            return
        room = model.n_ctx - n_prompt
        wanted = job.request.params.max_tokens
        job.max_new = min(wanted, room) if wanted is not None else room
        share = max(1, model.n_ctx // self.config.parallel)
        job.reserve = min(model.n_ctx, n_prompt + job.request.n * min(job.max_new, share))
        self._emit(job, PromptInfo(prompt_tokens=n_prompt))
        self._waiting.append(job)

    def _accept_score(self, job: ScoreJob) -> None:
        model = self.model
        assert model is not None
        limit = job.request.max_length
        for index, text in enumerate(job.request.texts):
            tokens = model.tokenize(text, add_special=True, parse_special=False)
            if limit is not None:
                tokens = tokens[:limit]
            if len(tokens) > model.n_ctx:
                self._reject(job, PromptTooLong(len(tokens), model.n_ctx, index=index))
                return
            job.texts.append(TextState(tokens, classify=model.is_classifier))
        total = sum(len(t.tokens) for t in job.texts)
        if total > self.config.max_score_tokens:
            job.texts.clear()
            self._reject(job, RequestTooLarge("tokens", total, self.config.max_score_tokens))
            return
        self._waiting.append(job)

    def _tokenize(self, prompt: ChatPrompt | str) -> list[int]:
        model = self.model
        assert model is not None and self._template is not None
        if isinstance(prompt, str):
            return model.tokenize(prompt, add_special=True, parse_special=False)
        text = self._template.render(prompt)
        tokens = model.tokenize(text, add_special=False, parse_special=True)
        if model.add_bos and (not tokens or tokens[0] != model.bos):
            tokens.insert(0, model.bos)
        return tokens

    def _reject(self, job: Job | ScoreJob, exc: EngineError) -> None:
        self._left_queue()
        self._emit(job, exc)

    def _can_admit(self, job: Job | ScoreJob) -> bool:
        if isinstance(job, ScoreJob):
            return True
        if len(self._slots) < job.request.n:
            return False
        return not self._active or self._reserved + job.reserve <= self.config.n_ctx

    def _admit(self) -> None:
        model = self.model
        assert model is not None
        while self._waiting and self._can_admit(self._waiting[0]):
            job = self._waiting.popleft()
            self._left_queue()
            if isinstance(job, ScoreJob):
                self._scoring.append(job)
                continue
            lead, common = self._slots.take_best(job.tokens)
            job.cached = self._reuse_prefix(lead, common, len(job.tokens))
            job.prefilled = job.cached
            seqs = [lead] + [self._take_cleared() for _ in range(job.request.n - 1)]
            params = job.request.params
            for i, seq in enumerate(seqs):
                sampler = Sampler(
                    params,
                    model.vocab,
                    model.n_vocab,
                    seed_offset=i,
                    gbnf=job.gbnf,
                    step_limit_s=self.config.grammar_step_limit_s,
                )
                job.choices.append(Choice(index=i, seq_id=seq, sampler=sampler, stops=params.stop))
            job.choices[0].n_past = job.cached
            if job.cached:
                self._prefix_hits += 1
                self._prefix_tokens += job.cached
            self._reserved += job.reserve
            self._active.append(job)
            while self._reserved + self._slots.cached_cells > model.n_ctx and self._evict_cache():
                pass

    def _reuse_prefix(self, seq: int, common: int, n_prompt: int) -> int:
        """Keep the first `common` cached cells of `seq` (at least one prompt token is always
        decoded again, for its logits); drop the rest. Returns how many were kept."""
        model = self.model
        assert model is not None
        common = min(common, n_prompt - 1)
        if (
            common > 0
            and lc.llama_memory_seq_pos_min(model.memory, seq) == 0
            and lc.llama_memory_seq_rm(model.memory, seq, common, -1)
        ):
            return common
        lc.llama_memory_seq_rm(model.memory, seq, -1, -1)
        return 0

    def _take_cleared(self) -> int:
        """A free sequence with its cached cells dropped."""
        model = self.model
        assert model is not None
        seq = self._slots.take_any()
        lc.llama_memory_seq_rm(model.memory, seq, -1, -1)
        return seq

    def _evict_cache(self) -> bool:
        """Drop the least recently used prompt cache; False when none is left."""
        model = self.model
        assert model is not None
        seq = self._slots.evict_lru()
        if seq is None:
            return False
        lc.llama_memory_seq_rm(model.memory, seq, -1, -1)
        return True

    def _abort(self, job: Job | ScoreJob) -> None:
        if job.cancelled:
            return
        job.cancelled = True
        if job in self._waiting:
            self._waiting.remove(job)
            self._left_queue()
        elif isinstance(job, ScoreJob):
            if job in self._scoring:
                self._scoring.remove(job)
        elif job in self._active:
            for choice in job.choices:
                if not choice.done:
                    self._finish(job, choice, "abort")

    def _decode_once(self, batch: TokenBatch) -> None:
        """One llama_decode: a score chunk or a generation batch, alternating when both wait.

        Scores must equal a lone decode of each text, and llama.cpp's CPU kernels do not give
        bit-identical rows across batch compositions or KV cache layouts. So texts are decoded
        one at a time, alone in the model's separate scoring context; chat streams only need
        to stay valid, and keep their own context and cache.
        """
        batch.clear()
        if self._scoring and (not self._active or self._score_turn):
            self._score_turn = False
            self._score_step(batch)
        else:
            self._score_turn = True
            self._generation_step(batch)

    def _generation_step(self, batch: TokenBatch) -> None:
        """Next token of every running choice, then prompt chunks, in one decode."""
        model = self.model
        assert model is not None
        stepping: list[tuple[int, Job, Choice]] = []
        for job in self._active:
            if job.prefilling:
                continue
            for choice in job.choices:
                if not choice.done:
                    idx = batch.add(choice.last_token, choice.n_past, choice.seq_id, True)
                    stepping.append((idx, job, choice))
        # While streams generate, prompts get a small share of each step (prefill_chunk tokens
        # per generating request each waiting prompt outnumbers them by), so a newcomer delays
        # the streams' next token by ~0.1 s instead of a whole batch, and a crowd of newcomers
        # behind one stream is not held back by it.
        budget = batch.room
        if stepping:
            generating = len({id(job) for _, job, _ in stepping})
            prefilling = sum(job.prefilling for job in self._active)
            budget = self.config.prefill_chunk * max(1, -(-prefilling // generating))
        prefills: list[tuple[Job, int, int | None]] = []
        for job in self._active:
            if not job.prefilling or batch.room == 0 or budget == 0:
                continue
            take = min(batch.room, budget, len(job.tokens) - job.prefilled)
            budget -= take
            last = job.prefilled + take == len(job.tokens)
            start = batch.add_span(
                job.tokens[job.prefilled : job.prefilled + take],
                job.prefilled,
                job.choices[0].seq_id,
                (take - 1,) if last else (),
            )
            prefills.append((job, take, start + take - 1 if last else None))
        if batch.n == 0:
            return
        if not self._decode(batch):
            return
        for idx, job, choice in stepping:
            choice.n_past += 1
            if not job.cancelled:
                self._on_token(job, choice, idx)
        for job, take, idx in prefills:
            job.prefilled += take
            lead = job.choices[0]
            lead.n_past = job.prefilled
            if idx is None or job.cancelled:
                continue
            for choice in job.choices[1:]:
                lc.llama_memory_seq_cp(model.memory, lead.seq_id, choice.seq_id, -1, -1)
                choice.n_past = lead.n_past
            for choice in job.choices:
                self._on_token(job, choice, idx)
        self._active = [j for j in self._active if not j.finished]

    def _score_step(self, batch: TokenBatch) -> None:
        """One chunk of the oldest score request's text: SCORE_CHUNK tokens, or fewer while
        chat streams wait on this step, or the text's tail."""
        model = self.model
        assert model is not None
        job = self._scoring[0]
        text = job.current_text()
        if text is not None and model.is_classifier:
            self._classify(batch, text)
            text = job.current_text()
        elif text is not None:
            ctx, memory = model.score_context()
            if text.fed == 0:
                lc.llama_memory_clear(memory, True)
            chunk = SCORE_CHUNK_BESIDE_STREAMS if self._active else SCORE_CHUNK
            take = min(len(text.tokens) - text.fed, chunk)
            outs = text.outputs_in(text.fed, take)
            batch.add_span(text.tokens[text.fed : text.fed + take], text.fed, 0, outs)
            rc = batch.decode(ctx)
            if rc != 0:
                raise RuntimeError(f"llama_decode (scoring) failed with status {rc}")
            top_n = job.request.top_logprobs
            for off in outs:
                row = model.logit_row(ctx, off)
                position = text.fed + off + 1
                target = text.tokens[position]
                if top_n is None:
                    text.logprobs.append(model.softmax.logprob(row, target))
                else:
                    detail = self._describe(row, position, target, top_n)
                    text.details.append(detail)
                    text.logprobs.append(detail.logprob)
            text.fed += take
            text = job.current_text()
        if text is None:
            self._scoring.pop(0)
            self._score_idle_since = time.monotonic()
            self._emit(job, job.result())

    def _classify(self, batch: TokenBatch, text: TextState) -> None:
        """A classifier scores a whole text in one decode: the head's first output."""
        model = self.model
        assert model is not None
        if model.memory:
            lc.llama_memory_clear(model.memory, True)
        n = len(text.tokens)
        batch.add_span(text.tokens, 0, 0, range(n))
        rc = batch.decode(model.ctx)
        if rc != 0:
            raise RuntimeError(f"llama_decode (classifier) failed with status {rc}")
        head = lc.llama_get_embeddings_seq(model.ctx, 0)
        text.logprobs.append(float(head[0]))
        text.fed = n

    def _decode(self, batch: TokenBatch) -> bool:
        """Decode the batch; on a full KV cache end the longest choice and report False."""
        model = self.model
        assert model is not None
        rc = batch.decode(model.ctx)
        if rc == 1:
            if not self._evict_cache():
                self._evict_longest()
            return False
        if rc != 0:
            raise RuntimeError(f"llama_decode failed with status {rc}")
        return True

    def _evict_longest(self) -> None:
        """The KV cache is full (nothing was stored): end the choice that holds the most cells."""
        running = [(c.n_past, j, c) for j in self._active for c in j.choices if not c.done]
        if not running:
            return
        _, job, choice = max(running, key=lambda t: t[0])
        log.warning("KV cache full: ending request %d choice %d early", job.rid, choice.index)
        self._emit_text(job, choice, self._drain_text(choice))
        self._finish(job, choice, "length")
        self._active = [j for j in self._active if not j.finished]

    def _on_token(self, job: Job, choice: Choice, idx: int) -> None:
        """Sample batch row `idx` for `choice`, then account for the token: end of
        generation, stop string, limits, or go on."""
        model = self.model
        assert model is not None
        token = choice.sampler.sample(model.ctx, idx, model.candidates)
        if token is None:  # the grammar allows nothing more
            self._emit_text(job, choice, self._drain_text(choice))
            self._finish(job, choice, "stop")
            return
        choice.n_gen += 1
        choice.generated.append(token)
        end = model.is_eog(token)
        top_n = job.request.params.logprobs
        if top_n is not None and not end:
            row = model.logit_row(model.ctx, idx)
            self._emit(job, self._describe(row, choice.index, token, top_n))
        if end:
            self._emit_text(job, choice, self._drain_text(choice))
            self._finish(job, choice, "stop")
            return
        text, hit = choice.stopper.push(choice.assembler.feed(model.piece(token)))
        self._emit_text(job, choice, text)
        if hit:
            self._finish(job, choice, "stop")
        elif choice.n_gen >= job.max_new or choice.n_past >= model.n_ctx or choice.sampler.slow:
            if choice.sampler.slow:
                log.warning(
                    "request %d choice %d: a grammar step took over %g s; answer ended early",
                    job.rid,
                    choice.index,
                    choice.sampler.step_limit_s,
                )
            self._emit_text(job, choice, self._drain_text(choice))
            self._finish(job, choice, "length")
        else:
            choice.last_token = token

    def _describe(self, row: np.ndarray, index: int, token: int, top_n: int) -> TokenLogprob:
        """`token`'s log-probability from a raw logit row, read in place (no copy of the row),
        and the `top_n` most likely tokens."""
        model = self.model
        assert model is not None
        lse = model.softmax.logsumexp(row)
        top: tuple[tuple[bytes, float], ...] = ()
        if top_n > 0:
            best = np.argpartition(row, -top_n)[-top_n:]
            best = best[np.argsort(row[best])[::-1]]
            top = tuple((model.piece(int(t)), float(row[t]) - lse) for t in best)
        return TokenLogprob(index, model.piece(token), float(row[token]) - lse, top)

    @staticmethod
    def _drain_text(choice: Choice) -> str:
        """Text still held back (an unfinished character, a partial stop string) at the end."""
        return choice.stopper.push(choice.assembler.flush())[0] + choice.stopper.flush()

    def _emit_text(self, job: Job, choice: Choice, text: str) -> None:
        if text:
            self._emit(job, TextDelta(choice.index, text))

    def _finish(self, job: Job, choice: Choice, reason: str) -> None:
        model = self.model
        assert model is not None
        choice.done = True
        choice.sampler.free()
        held = (job.tokens + choice.generated)[: choice.n_past]
        self._slots.give_back(choice.seq_id, held)
        if reason != "abort":
            self._emit(job, Finished(choice.index, reason, choice.n_gen, job.cached))
        if job.finished:
            self._reserved -= job.reserve

    def _fail_all(self, exc: EngineError) -> None:
        with self._cond:
            self._running = False
            leftovers = list(self._inbox) + list(self._waiting)
            self._inbox.clear()
        self._waiting.clear()
        for job in leftovers:
            self._emit(job, exc)
        for job in self._active:
            for choice in job.choices:
                if not choice.done:
                    self._finish(job, choice, "abort")
            self._emit(job, exc)
        self._active = []
        for sjob in self._scoring:
            self._emit(sjob, exc)
        self._scoring = []
        self._pending = 0
        self._flush()

    # ---- delivery -------------------------------------------------------------------------

    def _emit(self, job: Job | ScoreJob, event: object) -> None:
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
