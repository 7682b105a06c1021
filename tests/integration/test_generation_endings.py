"""Usage and the access-log line on every ending of a generation (issue 22), for each of the
four generating APIs, streamed and not: stop, length, a forced tool call, the request deadline,
an engine error, and a client that went away.

Every line has the prompt's tokens; where the API reports usage the line's counts are the
API's; where text came the line has a time to first token; an ending that left no usage for the
client (deadline, engine error, client gone) still counts the tokens whose text the handler
received. The engine is the session's real one on the default model; the deadline and
client-gone endings slow its tokens down (so that the generation cannot finish first on any
machine) and hold its events a while before the request ends, so that the line must count
exactly the tokens whose text the engine handed over; the engine error is a fault raised
inside the engine while it serves the request (worker.py ends that request alone with
EngineFault)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from aiohttp import ClientResponse
from aiohttp.test_utils import TestClient

from edgeserve.engine.delivery import Outbox
from edgeserve.engine.generating import Generating
from edgeserve.engine.jobs import Choice, Job
from edgeserve.engine.loop_wake import wake_for
from edgeserve.engine.types import TextDelta
from edgeserve.engine.worker import Engine
from tests.integration.conftest import EOS_BAN

ACCESS = "edgeserve.access"
PROMPT = "Count from 1 to 10, separated by commas."
STOP = [".", " is"]  # the greedy answers reach one of these within a few tokens
NO_ARGUMENTS = {"type": "object", "properties": {}}  # the shortest forced call
TOOL_TOKENS = 24
LENGTH_TOKENS = 3
LONG_TOKENS = 64  # at SLOW_TOKEN_S a token: 3.2 s, over twice the deadline
SLOW_TOKEN_S = 0.05
# Far too short for LONG_TOKENS. The engine is held once it has handed over the text of
# HOLD_AFTER tokens, so the deadline comes while it is held, and the text handed over has the
# rest of the deadline to reach the handler.
DEADLINE_S = 1.2
HOLD_AFTER = 2
HOLD_GUARD_S = 0.5
HOLD_LIMIT_S = 30.0  # how long a held engine waits for the abort
FAULT_AFTER = 2  # tokens a faulty generation makes before the engine fails it
LINE_WAIT_S = 10.0
LINE_FIELDS = (
    "status",
    "prompt_tokens",
    "completion_tokens",
    "cached_tokens",
    "ttft_ms",
    "error_status",
)

Body = dict[str, Any]


@dataclass(frozen=True)
class Usage:
    """Token counts as an API reports them: every prompt token (cached ones included), the
    generated tokens, the prompt tokens read from the prefix cache."""

    prompt: int
    completion: int
    cached: int


@dataclass(frozen=True)
class Api:
    """One generating API as these tests drive it: the request for PROMPT, the fields for each
    ending, and how to read its answer (whole, or as stream events) back."""

    name: str
    path: str
    request: Callable[[int, bool], Body]  # (max tokens, stream) → body
    stop: Body  # fields that make the greedy answer end with "stop"
    no_eos: Body  # fields that keep the answer from ending by itself, where the API has them
    tool: Body | None  # fields that force a call of tool "check"; None: the API has no tools
    usage: Callable[[Body], Usage]  # from the whole answer
    ending: Callable[[Body], str]  # "stop", "length" or "tool", from the whole answer
    whole: Callable[[list[Body]], Body]  # a finished stream's events as the whole answer
    is_output: Callable[[Body], bool]  # a stream event that carries generated text


def openai_usage(body: Body) -> Usage:
    usage = body["usage"]
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
    return Usage(usage["prompt_tokens"], usage["completion_tokens"], cached)


def openai_ending(body: Body) -> str:
    reason = body["choices"][0]["finish_reason"]
    return {"stop": "stop", "length": "length", "tool_calls": "tool"}[reason]


def openai_whole(events: list[Body]) -> Body:
    """Chat and completions streams: the finish reason's chunk and the usage chunk."""
    [reason] = [c["finish_reason"] for e in events for c in e["choices"] if c["finish_reason"]]
    [usage] = [e["usage"] for e in events if e.get("usage")]
    return {"choices": [{"finish_reason": reason}], "usage": usage}


def openai_stream(stream: bool) -> Body:
    return {"stream": True, "stream_options": {"include_usage": True}} if stream else {}


def responses_usage(body: Body) -> Usage:
    usage = body["usage"]
    return Usage(
        usage["input_tokens"],
        usage["output_tokens"],
        usage["input_tokens_details"]["cached_tokens"],
    )


def responses_ending(body: Body) -> str:
    if any(item["type"] == "function_call" for item in body["output"]):
        return "tool"
    return {"completed": "stop", "incomplete": "length"}[body["status"]]


def responses_whole(events: list[Body]) -> Body:
    ends = ("response.completed", "response.incomplete")
    [response] = [e["response"] for e in events if e.get("type") in ends]
    return response


def messages_usage(body: Body) -> Usage:
    usage = body["usage"]
    cached = usage["cache_read_input_tokens"]
    return Usage(usage["input_tokens"] + cached, usage["output_tokens"], cached)


def messages_ending(body: Body) -> str:
    reasons = {
        "end_turn": "stop",
        "stop_sequence": "stop",
        "max_tokens": "length",
        "tool_use": "tool",
    }
    return reasons[body["stop_reason"]]


def messages_whole(events: list[Body]) -> Body:
    [delta] = [e for e in events if e.get("type") == "message_delta"]
    return {"usage": delta["usage"], "stop_reason": delta["delta"]["stop_reason"]}


CHAT = Api(
    name="chat",
    path="/v1/chat/completions",
    request=lambda tokens, stream: {
        "model": "m",
        "messages": [{"role": "user", "content": PROMPT}],
        "max_tokens": tokens,
        "temperature": 0,
        **openai_stream(stream),
    },
    stop={"stop": STOP},
    no_eos={"logit_bias": EOS_BAN},
    tool={
        "tools": [{"type": "function", "function": {"name": "check", "parameters": NO_ARGUMENTS}}],
        "tool_choice": {"type": "function", "function": {"name": "check"}},
    },
    usage=openai_usage,
    ending=openai_ending,
    whole=openai_whole,
    is_output=lambda e: any(
        c["delta"].get("content") or c["delta"].get("tool_calls") for c in e.get("choices", [])
    ),
)
COMPLETIONS = Api(
    name="completions",
    path="/v1/completions",
    request=lambda tokens, stream: {
        "model": "m",
        "prompt": PROMPT,
        "max_tokens": tokens,
        "temperature": 0,
        **openai_stream(stream),
    },
    stop={"stop": STOP},
    no_eos={"logit_bias": EOS_BAN},
    tool=None,
    usage=openai_usage,
    ending=openai_ending,
    whole=openai_whole,
    is_output=lambda e: any(c["text"] for c in e.get("choices", [])),
)
RESPONSES = Api(
    name="responses",
    path="/v1/responses",
    request=lambda tokens, stream: {
        "model": "m",
        "input": PROMPT,
        "max_output_tokens": tokens,
        "temperature": 0,
        "stream": stream,
    },
    # No stop strings: the grammar of a JSON boolean ends the answer.
    stop={
        "text": {"format": {"type": "json_schema", "name": "yes", "schema": {"type": "boolean"}}}
    },
    no_eos={},  # no logit_bias: the greedy answer rambles on (and the engine is slowed)
    tool={
        "tools": [{"type": "function", "name": "check", "parameters": NO_ARGUMENTS}],
        "tool_choice": {"type": "function", "name": "check"},
    },
    usage=responses_usage,
    ending=responses_ending,
    whole=responses_whole,
    is_output=lambda e: str(e.get("type")).endswith(".delta"),
)
MESSAGES = Api(
    name="messages",
    path="/v1/messages",
    request=lambda tokens, stream: {
        "model": "m",
        "messages": [{"role": "user", "content": PROMPT}],
        "max_tokens": tokens,
        "temperature": 0,
        "stream": stream,
    },
    stop={"stop_sequences": STOP},
    no_eos={},  # no logit_bias: the greedy answer rambles on (and the engine is slowed)
    tool={
        "tools": [{"name": "check", "input_schema": NO_ARGUMENTS}],
        "tool_choice": {"type": "tool", "name": "check"},
    },
    usage=messages_usage,
    ending=messages_ending,
    whole=messages_whole,
    is_output=lambda e: e.get("type") == "content_block_delta",
)
APIS = [CHAT, COMPLETIONS, RESPONSES, MESSAGES]


def cases(*endings: str) -> list[Any]:
    """(api, stream, ending) for every API, whole and streamed, and each of `endings`; no tool
    call for the API that has no tools (legacy completions)."""
    return [
        pytest.param(
            api, stream, ending, id=f"{ending}-{api.name}-{'stream' if stream else 'whole'}"
        )
        for ending in endings
        for api in APIS
        if not (ending == "tool" and api.tool is None)
        for stream in (False, True)
    ]


CASE = ("api", "stream", "ending")


# ---- reading answers and the access log ---------------------------------------------------


@dataclass
class Outcome:
    """One request as the client saw it: the status, the whole answer (a JSON body, or a
    finished stream read back as one), the stream's events, and how many of them carried
    generated text."""

    status: int
    body: Body | None
    events: list[Body]
    outputs: int


def sse_payload(block: bytes) -> Body | None:
    """The JSON payload of one SSE event; None for a comment or `[DONE]`."""
    data = [line for line in block.decode().split("\n") if line.startswith("data: ")]
    if not data or data[0] == "data: [DONE]":
        return None
    payload: Body = json.loads(data[0].removeprefix("data: "))
    return payload


async def read_events(resp: ClientResponse, api: Api, *, until_output: bool = False) -> Outcome:
    """Read a stream's events to its end, or only up to the first that carries text."""
    events: list[Body] = []
    outputs = 0
    while block := await resp.content.readuntil(b"\n\n"):
        payload = sse_payload(block)
        if payload is None:
            continue
        events.append(payload)
        outputs += api.is_output(payload)
        if until_output and outputs:
            break
    return Outcome(resp.status, None, events, outputs)


async def send(client: TestClient, api: Api, body: Body, request_id: str) -> Outcome:
    """POST `body` and read the answer; a stream that finished is read back as a whole."""
    resp = await client.post(api.path, json=body, headers={"X-Request-Id": request_id})
    if not body.get("stream") or resp.status != 200:
        return Outcome(resp.status, await resp.json(), [], 0)
    outcome = await read_events(resp, api)
    if not is_failure(outcome.events[-1]):
        outcome.body = api.whole(outcome.events)
    return outcome


def is_failure(event: Body) -> bool:
    """The error event that ends a failed stream (OpenAI's shape, or Anthropic's)."""
    return "error" in event and event.get("type") in (None, "error")


async def access_line(caplog: pytest.LogCaptureFixture, request_id: str) -> Body:
    """The fields of the request's access-log line, once it has been written (a stream's line
    comes after its last byte, a cancelled request's once its handler has unwound)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + LINE_WAIT_S
    while True:
        lines = [
            r
            for r in caplog.records
            if r.name == ACCESS and getattr(r, "request_id", 0) == request_id
        ]
        if lines:
            [line] = lines
            return {key: vars(line)[key] for key in LINE_FIELDS if key in vars(line)}
        assert loop.time() < deadline, f"no access-log line for {request_id}"
        await asyncio.sleep(0.01)


def check_line(line: Body, api: Api, outcome: Outcome, max_tokens: int) -> None:
    """What every ending's line holds: the prompt's tokens; the API's own counts where it
    reported usage; a time to first token once text came; and at least one token per text
    event the client got."""
    assert line.get("prompt_tokens", 0) > 0, f"no prompt tokens: {line}"
    if outcome.body is not None and outcome.status == 200:
        usage = api.usage(outcome.body)
        assert line["prompt_tokens"] == usage.prompt, (line, usage)
        assert line["completion_tokens"] == usage.completion, (line, usage)
        assert line.get("cached_tokens", 0) == usage.cached, (line, usage)
        assert (usage.completion > 0) == ("ttft_ms" in line), (line, usage)
    if outcome.outputs:
        assert "ttft_ms" in line, line
    if "ttft_ms" in line:
        assert line["completion_tokens"] >= max(outcome.outputs, 1), (
            f"text came ({outcome.outputs} text events) but the line counts "
            f"{line['completion_tokens']} generated tokens: {line}"
        )
    assert 0 <= line["completion_tokens"] <= max_tokens, line


# ---- the engine, slowed down or failing ---------------------------------------------------


@dataclass
class Slowed:
    """The engine while slowed (one request of the test at a time): `tokens`, how many tokens
    of the request it had handed text of to the test's event loop when it was held; from `hold_at`
    (time.monotonic()), or once it has handed over the text of `hold_after` tokens, it hands
    over nothing more until the request is aborted (`aborted`, set by Engine.cancel)."""

    tokens: int = 0
    hold_at: float = math.inf
    hold_after: int | None = None
    aborted: threading.Event = field(default_factory=threading.Event)

    def hold(self) -> None:
        """Hand over nothing more from now on."""
        self.hold_at = time.monotonic()


@contextlib.contextmanager
def engine_tokens(*, fail_after: int | None = None) -> Iterator[Slowed]:
    """While inside: each token the engine accounts for waits SLOW_TOKEN_S first (a long
    generation outlives a short deadline on any machine); at the end of a step past
    `hold_at` the engine waits, its events undelivered, until the request is aborted; and
    with `fail_after` a choice's next token after its first `fail_after` raises inside the
    engine, which ends that request alone with EngineFault. (The session's engine is the
    only one in this process.)"""
    on_token, flush, cancel = Generating._on_token, Outbox.flush, Engine.cancel
    slowed = Slowed()
    # the test's loop (an earlier test's request may still end), as the engine reaches it
    loop = wake_for(asyncio.get_running_loop())

    def slow_or_failing(
        self: Generating, job: Job, choice: Choice, token: int | None, logits: Any
    ) -> None:
        if fail_after is not None and choice.n_gen >= fail_after:
            raise RuntimeError("a fault injected by the test")
        time.sleep(SLOW_TOKEN_S)
        on_token(self, job, choice, token, logits)

    def held_or_counted(self: Outbox, acknowledged: bool = False) -> list[threading.Lock]:
        if time.monotonic() >= slowed.hold_at:
            # (never raised here, on the engine thread: a request never aborted shows in
            # its line, and the session's engine goes on)
            slowed.aborted.wait(HOLD_LIMIT_S)
        else:
            events = [event for _, event in self._items.get(loop, [])]
            texts = [event.generated for event in events if isinstance(event, TextDelta)]
            slowed.tokens = max([slowed.tokens, *texts])
            if slowed.hold_after is not None and slowed.tokens >= slowed.hold_after:
                slowed.hold()  # these events still go: the next flush waits
        return flush(self, acknowledged)

    def cancelled(self: Engine, job: Any) -> None:
        cancel(self, job)
        slowed.aborted.set()

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(Generating, "_on_token", slow_or_failing)
        patch.setattr(Outbox, "flush", held_or_counted)
        patch.setattr(Engine, "cancel", cancelled)
        yield slowed


def check_cut_short(line: Body, slowed: Slowed) -> None:
    """A request cut short while held (the deadline, its client gone): the line counts every
    token whose text the engine handed over before it was held, no more, no fewer (and some
    were)."""
    assert line["completion_tokens"] == slowed.tokens > 0, (line, slowed)


@pytest.fixture
def access_log(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    caplog.set_level(logging.INFO, logger=ACCESS)
    return caplog


def new_id() -> str:
    return f"endings-{uuid.uuid4().hex}"


# ---- the endings ----------------------------------------------------------------------------


def finished_request(api: Api, ending: str, stream: bool) -> tuple[Body, int]:
    """The request that ends with `ending` ("stop", "length" or "tool"), and its max tokens."""
    fields, tokens = {
        "stop": (api.stop, 16),
        "length": (api.no_eos, LENGTH_TOKENS),
        "tool": (api.tool, TOOL_TOKENS),
    }[ending]
    assert fields is not None
    return api.request(tokens, stream) | fields, tokens


@pytest.mark.parametrize(CASE, cases("stop", "length", "tool"))
async def test_finished(client, access_log, api: Api, stream: bool, ending: str) -> None:
    body, max_tokens = finished_request(api, ending, stream)
    outcome = await send(client, api, body, rid := new_id())
    assert outcome.status == 200 and outcome.body is not None
    assert api.ending(outcome.body) == ending, outcome.body
    line = await access_line(access_log, rid)
    assert line["status"] == 200 and "error_status" not in line, line
    if ending == "length":
        assert line["completion_tokens"] == max_tokens, line
    check_line(line, api, outcome, max_tokens)


@pytest.mark.parametrize(CASE, cases("deadline"))
async def test_deadline(make_client, access_log, api: Api, stream: bool, ending: str) -> None:
    client = await make_client(request_timeout_s=DEADLINE_S)
    body = api.request(LONG_TOKENS, stream) | api.no_eos
    with engine_tokens() as slowed:
        slowed.hold_after = HOLD_AFTER
        outcome = await send(client, api, body, rid := new_id())
        line = await access_line(access_log, rid)
    if stream:
        assert outcome.status == 200 and is_failure(outcome.events[-1]), outcome.events[-1:]
        assert line["status"] == 200 and line.get("error_status") == 504, line
    else:
        assert outcome.status == 504, outcome.body
        assert line["status"] == 504 and "error_status" not in line, line
    check_line(line, api, outcome, LONG_TOKENS)
    check_cut_short(line, slowed)


@pytest.mark.parametrize(CASE, cases("engine-error"))
async def test_engine_error(client, access_log, api: Api, stream: bool, ending: str) -> None:
    body = api.request(16, stream) | api.no_eos
    with engine_tokens(fail_after=FAULT_AFTER):
        outcome = await send(client, api, body, rid := new_id())
        line = await access_line(access_log, rid)
    if stream:
        assert outcome.status == 200 and is_failure(outcome.events[-1]), outcome.events[-1:]
        assert outcome.outputs > 0, "text came before the fault"
        assert line["status"] == 200 and line.get("error_status") == 500, line
    else:
        assert outcome.status == 500, outcome.body
        assert line["status"] == 500 and "error_status" not in line, line
    check_line(line, api, outcome, FAULT_AFTER)
    # the fault's event comes after the text of every token made before it
    assert line["completion_tokens"] == FAULT_AFTER, line


@pytest.mark.parametrize(CASE, cases("client-gone"))
async def test_client_gone(client, access_log, api: Api, stream: bool, ending: str) -> None:
    body = api.request(LONG_TOKENS, stream) | api.no_eos
    # The same prompt once before, so that the cut request's prompt comes from the cache.
    warm = await client.post(api.path, json=api.request(1, stream=False))
    assert warm.status == 200, await warm.text()
    rid = new_id()
    with engine_tokens() as slowed:
        if stream:
            resp = await client.post(api.path, json=body, headers={"X-Request-Id": rid})
            outcome = await read_events(resp, api, until_output=True)
            assert outcome.outputs == 1, outcome.events
            slowed.hold()
            await asyncio.sleep(HOLD_GUARD_S)  # what was handed over reaches the handler
            resp.close()
        else:
            task = asyncio.create_task(
                client.post(api.path, json=body, headers={"X-Request-Id": rid})
            )
            while not slowed.tokens:  # admitted, and text handed over
                await asyncio.sleep(0.01)
            slowed.hold()
            await asyncio.sleep(HOLD_GUARD_S)
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            outcome = Outcome(0, None, [], 0)
        line = await access_line(access_log, rid)
    assert line["status"] == 499 and "error_status" not in line, line
    check_line(line, api, outcome, LONG_TOKENS)
    assert slowed.tokens >= 1, slowed  # it was cut after its text came
    check_cut_short(line, slowed)
    assert line.get("cached_tokens", 0) > 0, f"the cached prompt is not counted: {line}"
