"""One generation run on an engine in process (no HTTP), its events collected."""

from __future__ import annotations

from edgeserve.engine.client import EngineClient
from edgeserve.engine.types import Finished, GenerationRequest, TextDelta
from edgeserve.engine.worker import Engine


async def collect(engine: Engine, request: GenerationRequest) -> tuple[str, Finished, int]:
    """The answer's text, how it ended, and the prompt's tokens."""
    text, finished = "", None
    async with EngineClient(engine).generate(request) as generation:
        info = await generation.submit()
        async for event in generation.events():
            if isinstance(event, TextDelta):
                text += event.text
            elif isinstance(event, Finished):
                finished = event
    assert finished is not None
    return text, finished, info.prompt_tokens
