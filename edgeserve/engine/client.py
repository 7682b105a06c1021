"""The asyncio side of the engine: submit work, await its events, abort on cancellation."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import AsyncIterator, Callable
from types import TracebackType

from edgeserve.engine.adapters import Adapter, AdapterCatalog
from edgeserve.engine.jobs import AnyJob, Job, Prompt, Sink
from edgeserve.engine.loop_wake import wake_for
from edgeserve.engine.scoring import TextState
from edgeserve.engine.types import (
    ChatPrompt,
    EmbedRequest,
    EmbedResult,
    EngineStats,
    Finished,
    GenerationRequest,
    MediaKind,
    PromptInfo,
    SamplingParams,
    ScoreRequest,
    ScoreResult,
    TextDelta,
    Tokenization,
    TokenizerInfo,
    TokenLogprob,
)
from edgeserve.engine.worker import Engine
from edgeserve.errors import EngineError


class Generation:
    """One request, bound to the event loop that runs it.

    Use as an async context manager: leaving it early (an exception, a cancelled handler, a
    client that went away) aborts the request so its sequences are freed within one step.
    """

    def __init__(self, engine: Engine, request: GenerationRequest) -> None:
        self._engine = engine
        self._request = request
        self._queue: asyncio.Queue[object] = asyncio.Queue()
        self._job: Job | None = None
        self._open = 0
        self.drafted = 0  # speculation's drafted tokens over the finished choices
        self.draft_accepted = 0

    async def __aenter__(self) -> Generation:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._job is not None and self._open:
            self._engine.cancel(self._job)

    async def submit(self) -> PromptInfo:
        """Render and tokenize the prompt on a prepare thread, then queue it for the engine;
        returns once queued, not once running (raises the engine's rejection: too long, a bad
        grammar, a full queue)."""
        prompt: Prompt = await asyncio.wrap_future(self._engine.prepare_async(self._request))
        sink = Sink(wake_for(asyncio.get_running_loop()), self._queue.put_nowait)
        self._job = self._engine.submit(self._request, prompt, sink)
        self._open = self._request.n
        return PromptInfo(prompt_tokens=len(prompt.tokens))

    async def events(self) -> AsyncIterator[TextDelta | TokenLogprob | Finished]:
        """Yield text deltas (and token log-probs, when asked) until every choice finished."""
        while self._open:
            event = await self._queue.get()
            if isinstance(event, EngineError):
                self._open = 0
                raise event
            if isinstance(event, Finished):
                self._open -= 1
                self.drafted += event.drafted
                self.draft_accepted += event.draft_accepted
            assert isinstance(event, TextDelta | TokenLogprob | Finished)
            yield event


class EngineClient:
    """What the HTTP layer holds: start generations, read stats, manage the engine's life."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def generate(self, request: GenerationRequest) -> Generation:
        """A generation to use with `async with`."""
        return Generation(self.engine, request)

    def stats(self) -> EngineStats:
        """The engine's current counters."""
        return self.engine.stats()

    async def score(self, request: ScoreRequest) -> ScoreResult:
        """Score texts; cancelling the awaiting task aborts the work in the engine."""
        texts: list[TextState] = await asyncio.wrap_future(self.engine.prepare_async(request))
        result = await self._one_result(functools.partial(self.engine.submit_score, request, texts))
        assert isinstance(result, ScoreResult)
        return result

    async def embed(self, request: EmbedRequest) -> EmbedResult:
        """Embed texts; cancelling the awaiting task aborts the work in the engine."""
        texts: list[list[int]] = await asyncio.wrap_future(self.engine.prepare_async(request))
        result = await self._one_result(functools.partial(self.engine.submit_embed, request, texts))
        assert isinstance(result, EmbedResult)
        return result

    async def _one_result(self, submit: Callable[[Sink], AnyJob]) -> object:
        """Submit a job whose one event is its result; raise its EngineError, and abort it
        when the awaiting task is cancelled."""
        queue: asyncio.Queue[object] = asyncio.Queue()
        job = submit(Sink(wake_for(asyncio.get_running_loop()), queue.put_nowait))
        try:
            event = await queue.get()
        except asyncio.CancelledError:
            self.engine.cancel(job)
            raise
        if isinstance(event, EngineError):
            raise event
        return event

    @property
    def adapters(self) -> AdapterCatalog:
        """The LoRA adapters loaded over the model (any thread reads them)."""
        return self.engine.adapters

    @property
    def dedicated_embeddings(self) -> bool:
        """True when a separate --embedding-model answers embeddings."""
        return self.engine.config.embedding_model_path is not None

    async def load_adapter(self, name: str, path: str) -> Adapter:
        """Load a LoRA adapter between engine steps (AdapterRefused when it may not load)."""
        return await asyncio.wrap_future(self.engine.load_adapter(name, path))

    async def unload_adapter(self, name: str) -> Adapter:
        """Unload an adapter between engine steps (UnknownAdapter, AdapterInUse)."""
        return await asyncio.wrap_future(self.engine.unload_adapter(name))

    @property
    def embedding_size(self) -> int:
        """The length of the model's embedding vectors (EngineLoading before it is loaded)."""
        return self.engine.embedding_size

    async def count_prompt_tokens(self, prompt: ChatPrompt) -> int:
        """The tokens of a conversation as a generation would send it to the model (the
        template rendered, tools included), on a prepare thread (raises PromptTooLong)."""
        request = GenerationRequest(prompt=prompt, params=SamplingParams())
        prepared = await asyncio.wrap_future(self.engine.prepare_async(request))
        return len(prepared.tokens)

    async def tokenize(self, request: Tokenization) -> list[int]:
        """The model's tokens for a text, tokenized on a prepare thread."""
        return await asyncio.wrap_future(
            self.engine.on_prepare_thread(self.engine.tokenize, request)
        )

    async def detokenize(self, tokens: tuple[int, ...], *, special: bool) -> str:
        """The text of `tokens`, on a prepare thread (raises UnknownToken)."""
        work = functools.partial(self.engine.detokenize, tokens, special=special)
        return await asyncio.wrap_future(self.engine.on_prepare_thread(work))

    def tokenizer_info(self) -> TokenizerInfo:
        """The loaded model's tokenizer description (raises EngineLoading before)."""
        return self.engine.tokenizer_info()

    @property
    def loaded(self) -> bool:
        """True once the model is loaded (until then, work is refused with EngineLoading)."""
        return self.engine.loaded

    @property
    def media_kinds(self) -> frozenset[MediaKind]:
        """The media the model takes besides text ("image", "audio"): empty without --mmproj
        and before the model is loaded."""
        return self.engine.media_kinds

    @property
    def can_generate(self) -> bool:
        """False for classifier / reranker models, which only score."""
        return self.engine.can_generate
