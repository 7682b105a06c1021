"""POST /v1/completions (OpenAI's legacy text completions), streamed (SSE) and not.

Each prompt is one engine request (raw text with BOS and no chat template, or token ids as
given), all submitted together so they share decode steps; choice `i * n + j` is answer j to
prompt i, OpenAI's order. With `echo` and `logprobs` (or `max_tokens: 0`) the prompts are also
scored, and their tokens lead each choice's log-probabilities, one entry per prompt token: a
text's first token has its value (it is predicted from BOS), the first of a token prompt has
none (nothing predicts it). A token prompt echoes as its tokens' text.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field, replace

from aiohttp import web

from edgeserve import responses, validation
from edgeserve.engine.client import EngineClient, Generation
from edgeserve.engine.types import Finished, PromptInfo, ScoreResult, TextDelta, TokenLogprob
from edgeserve.errors import ApiError, EngineError
from edgeserve.http.handlers.common import authenticated_body, engine_errors, off_loop
from edgeserve.http.keys import ENGINE, LIMITS, RECORD, SETTINGS
from edgeserve.http.sse import EventStream
from edgeserve.logprobs import AlignedLogprob, LogprobAligner, prompt_entries
from edgeserve.protocol import CompletionRequest


async def completions(request: web.Request) -> web.StreamResponse:
    """Validate everything, submit one generation per prompt, wait until every prompt is
    admitted, then answer as JSON or as a stream."""
    body, large = await authenticated_body(request)
    req = await off_loop(large, validation.parse_completion_request, body)
    engine = request.app[ENGINE]
    validation.check_can_generate(engine.can_generate)
    work = await off_loop(large, validation.prepare_completion, req, request.app[LIMITS])
    settings = request.app[SETTINGS]
    model = settings.model_name if req.model is None else req.model
    started = time.perf_counter()
    deadline = asyncio.get_running_loop().time() + settings.request_timeout_s
    limit = asyncio.timeout_at(deadline)
    async with (
        engine_errors(limit, settings.request_timeout_s),
        contextlib.AsyncExitStack() as stack,
    ):
        gens = [await stack.enter_async_context(engine.generate(g)) for g in work.generations]
        request[RECORD].generations += gens
        async with limit:
            infos = []
            for index, gen in enumerate(gens):
                try:
                    infos.append(await gen.admitted())
                except EngineError as exc:
                    raise validation.completion_engine_error(exc, work.names, index) from exc
            leads = await _leads(engine, work, req.echo)
            run = _Run(request, req, model, leads, infos, started)
            if work.scoring is not None:
                try:
                    run.echoed(await engine.score(work.scoring))
                except EngineError as exc:
                    raise validation.completion_engine_error(exc, work.names) from exc
            if not req.stream:
                return await _collect(run, gens)
        return await _stream(run, gens, deadline)


async def _leads(engine: EngineClient, work: validation.CompletionWork, echo: bool) -> list[str]:
    """The text each prompt's choices start with: with `echo` the prompt (token ids as their
    text, special tokens as none, as its echoed tokens show them), else nothing."""
    leads = []
    for index, prompt in enumerate(work.prompts):
        if not echo:
            leads.append("")
        elif isinstance(prompt, str):
            leads.append(prompt)
        else:
            try:
                leads.append(await engine.detokenize(prompt.ids, special=False))
            except EngineError as exc:
                raise validation.completion_engine_error(exc, work.names, index) from exc
    return leads


@dataclass
class _Run:
    """One admitted completion request and what it has produced so far; `leads` is the text
    each prompt's choices start with (see `_leads`)."""

    request: web.Request
    req: CompletionRequest
    model: str
    leads: list[str]
    infos: list[PromptInfo]
    started: float
    completion_tokens: int = 0
    cached: dict[int, int] = field(default_factory=dict)
    first: float | None = None
    prompt_logprobs: list[list[AlignedLogprob]] | None = None

    def echoed(self, result: ScoreResult) -> None:
        """Keep the scored prompts' token entries (and, when nothing is generated, their
        token counts)."""
        assert result.tokens is not None
        self.prompt_logprobs = [prompt_entries(tokens) for tokens in result.tokens]
        if not self.infos:
            self.infos = [PromptInfo(prompt_tokens=result.n_tokens)]

    def echo_entries(self, index: int) -> list[AlignedLogprob]:
        """The prompt's token entries that lead choice `index`'s log-probabilities."""
        if self.prompt_logprobs is None:
            return []
        return self.prompt_logprobs[index // self.req.n]

    def offset(self, index: int) -> int:
        """Where generated text starts in choice `index`'s text (after an echoed prompt)."""
        return len(self.lead_of(index))

    def account(self, event: TextDelta | TokenLogprob | Finished) -> None:
        """Count a finished choice's tokens (and its prompt's cached tokens); note the first
        text's time."""
        if isinstance(event, TextDelta):
            self.first = self.first or time.perf_counter()
        elif isinstance(event, Finished):
            self.completion_tokens += event.completion_tokens
            self.cached[event.index // self.req.n] = event.cached_tokens

    def lead_of(self, index: int) -> str:
        """The text choice `index` starts with."""
        return self.leads[index // self.req.n]

    @property
    def prompt_tokens(self) -> int:
        """Summed over the prompts (each counted once, whatever n is), as OpenAI does."""
        return sum(info.prompt_tokens for info in self.infos)

    @property
    def cached_tokens(self) -> int | None:
        """Prompt tokens served from the prefix cache, None when there were none."""
        return sum(self.cached.values()) or None

    def record(self) -> None:
        """Fill the access-log record."""
        self.request[RECORD].generated(
            self.prompt_tokens,
            self.completion_tokens,
            self.cached_tokens or 0,
            self.started,
            self.first,
        )


class _Merged:
    """The events of several generations as one stream, choice indices offset by
    `prompt index × n`. Call `aclose` when done (it stops the pump tasks)."""

    def __init__(self, gens: list[Generation], n: int) -> None:
        self._queue: asyncio.Queue[TextDelta | TokenLogprob | Finished | EngineError | None] = (
            asyncio.Queue()
        )
        self._left = len(gens)
        self._tasks = [
            asyncio.create_task(self._pump(gen, position * n)) for position, gen in enumerate(gens)
        ]

    async def _pump(self, gen: Generation, offset: int) -> None:
        try:
            async for event in gen.events():
                self._queue.put_nowait(replace(event, index=event.index + offset))
        except EngineError as exc:
            self._queue.put_nowait(exc)
        self._queue.put_nowait(None)

    async def events(self) -> AsyncIterator[TextDelta | TokenLogprob | Finished]:
        """Every event, in arrival order; raises the first engine error."""
        while self._left:
            item = await self._queue.get()
            if item is None:
                self._left -= 1
            elif isinstance(item, EngineError):
                raise item
            else:
                yield item

    async def aclose(self) -> None:
        """Stop the pumps (the generations themselves are aborted by their owner)."""
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)


async def _collect(run: _Run, gens: list[Generation]) -> web.Response:
    req = run.req
    count = len(run.leads) * req.n
    texts = [run.lead_of(i) for i in range(count)]
    reasons = ["length"] * count
    entries = [list(run.echo_entries(i)) for i in range(count)]
    aligner = LogprobAligner(run.offset, release_at_end=True)
    merged = _Merged(gens, req.n)
    try:
        async for event in merged.events():
            run.account(event)
            entries[event.index] += aligner.feed(event)
            if isinstance(event, TextDelta):
                texts[event.index] += event.text
            elif isinstance(event, Finished):
                reasons[event.index] = event.reason
    finally:
        await merged.aclose()
    run.record()
    body = responses.completion_body(
        responses.new_text_completion_id(),
        run.model,
        list(zip(texts, reasons, strict=True)),
        run.prompt_tokens,
        run.completion_tokens,
        run.cached_tokens,
        logprobs=None if req.logprobs is None else entries,
    )
    return web.Response(body=body, content_type="application/json")


async def _stream(run: _Run, gens: list[Generation], deadline: float) -> web.StreamResponse:
    req = run.req
    request = run.request
    cid = responses.new_text_completion_id()
    created = int(time.time())
    include_usage = bool(req.stream_options and req.stream_options.include_usage)
    stream = EventStream(request, request.app[SETTINGS].ping_interval_s)
    async with stream:
        if req.echo:
            for index in range(len(run.leads) * req.n):
                echo = responses.completion_chunk(
                    cid,
                    run.model,
                    created,
                    index,
                    run.lead_of(index),
                    None if gens else "length",
                    None if req.logprobs is None else run.echo_entries(index),
                )
                if not await stream.send(echo):
                    return stream.response
        aligner = LogprobAligner(run.offset, release_at_end=True)
        merged = _Merged(gens, req.n)
        limit = asyncio.timeout_at(deadline)
        try:
            async with limit:
                async for event in merged.events():
                    run.account(event)
                    released = aligner.feed(event)
                    if isinstance(event, TokenLogprob):
                        continue
                    text, reason = (
                        (event.text, None) if isinstance(event, TextDelta) else ("", event.reason)
                    )
                    chunk = responses.completion_chunk(
                        cid,
                        run.model,
                        created,
                        event.index,
                        text,
                        reason,
                        None if req.logprobs is None else released,
                    )
                    if not await stream.send(chunk):
                        return stream.response
        except EngineError as exc:
            await _end_with_error(run, stream, validation.engine_error(exc))
            return stream.response
        except TimeoutError:
            if not limit.expired():
                raise
            seconds = request.app[SETTINGS].request_timeout_s
            await _end_with_error(run, stream, validation.request_timeout(seconds))
            return stream.response
        finally:
            await merged.aclose()
        if include_usage:
            usage = responses.completion_usage_chunk(
                cid, run.model, created, run.prompt_tokens, run.completion_tokens, run.cached_tokens
            )
            await stream.send(usage)
        await stream.send(responses.sse_event("[DONE]"))
        run.record()
    return stream.response


async def _end_with_error(run: _Run, stream: EventStream, err: ApiError) -> None:
    """An error after the stream started: one error event, then [DONE]."""
    run.record()
    run.request[RECORD].error_status = err.status
    await stream.send(responses.stream_error_event(err.status, err.detail))
    await stream.send(responses.sse_event("[DONE]"))
