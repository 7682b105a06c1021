"""What the client tests ask for: a small structured answer and one tool; and the server's own
answers as the library received them, to hold what it made of them to."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
from pydantic import BaseModel, Field


class City(BaseModel):
    """A city and the country it is in."""

    name: str = Field(max_length=20)
    country: str = Field(max_length=20)


CITY_PROMPT = "Name the capital of France and its country."
HELLO_PROMPT = "Say hello in one word."
COUNT_PROMPT = "Count from one to five."
WEATHER_PARAMETERS = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 20}},
    "required": ["city"],
}
WEATHER_PROMPT = "What is the weather in Paris?"


def get_weather(city: str) -> str:
    """Weather forecast for a city."""
    return f"sunny in {city}"


class Answers:
    """An HTTP client for a library that keeps the chat completions (and completions) it
    received, whole or streamed: the server's own answer, to hold what the library made of
    it to."""

    def __init__(self) -> None:
        self.texts: list[str] = []  # each answer's call arguments, or else its text
        self.http = httpx.AsyncClient(event_hooks={"response": [self._keep]})

    async def _keep(self, response: httpx.Response) -> None:
        if not response.url.path.endswith("/completions") or response.status_code != 200:
            return
        if response.headers["content-type"].startswith("text/event-stream"):
            # Read as the library reads it, event by event; kept once it has ended.
            response.stream = _Tee(response.stream, self.texts)
        else:
            await response.aread()  # the library reads the same bytes after this
            choice = response.json()["choices"][0]
            message = choice.get("message") or {"content": choice.get("text")}
            calls = message.get("tool_calls")
            self.texts.append(calls[0]["function"]["arguments"] if calls else message["content"])

    def last(self) -> str:
        """The server's own text (or call arguments) in the last answer the library received."""
        assert self.texts, "no chat completion reached the library"
        assert self.texts[-1], "the server's own answer is empty"
        return self.texts[-1]

    def city(self) -> dict[str, Any]:
        """The fields of the City in the last answer (a library may answer a subclass)."""
        return City.model_validate_json(self.texts[-1]).model_dump()


class _Tee(httpx.AsyncByteStream):
    """A response's byte stream, passed on as it comes; once the library is done with it,
    its answer goes into `texts`."""

    def __init__(self, stream: httpx.AsyncByteStream, texts: list[str]) -> None:
        self._stream = stream
        self._texts = texts
        self._chunks: list[bytes] = []

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for chunk in self._stream:
            self._chunks.append(chunk)
            yield chunk

    async def aclose(self) -> None:
        await self._stream.aclose()
        self._texts.append(_streamed_answer(b"".join(self._chunks).decode()))


def _streamed_answer(body: str) -> str:
    """Choice 0's call arguments, or else its text, put together from an SSE body."""
    arguments: list[str] = []
    content: list[str] = []
    for line in body.splitlines():
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        for choice in json.loads(line[len("data: ") :]).get("choices", []):
            delta = choice.get("delta") or {"content": choice.get("text")}
            content.append(delta.get("content") or "")
            for call in delta.get("tool_calls") or []:
                arguments.append(call.get("function", {}).get("arguments") or "")
    return "".join(arguments) if arguments else "".join(content)
