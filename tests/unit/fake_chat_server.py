"""A stand-in for a server's streamed POST /v1/chat/completions, for the bench's tests of its
own logic (which requests it sends, in which turns): it answers `max_tokens` one-word deltas,
then the finish, usage and [DONE]."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from aiohttp import web


def streaming_chat_app(record: Callable[[dict[str, Any]], None]) -> web.Application:
    """The app; `record` gets each request's JSON body."""

    async def chat(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        record(body)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for i in range(body["max_tokens"]):
            delta = {"choices": [{"delta": {"content": f"w{i} "}, "finish_reason": None}]}
            await resp.write(f"data: {json.dumps(delta)}\n\n".encode())
        end = {
            "choices": [{"delta": {}, "finish_reason": "length"}],
            "usage": {"completion_tokens": body["max_tokens"], "prompt_tokens": 9},
        }
        await resp.write(f"data: {json.dumps(end)}\n\ndata: [DONE]\n\n".encode())
        return resp

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    return app
