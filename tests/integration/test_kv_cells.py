"""KV cells are counted once however many sequences hold them: the choices of an n=4 answer
share their prompt's cells (`seq_cp`), so the cache holds the prompt once and each choice's
own tokens, and `llamacpp:kv_cache_usage_ratio` never exceeds 1."""

from __future__ import annotations

import uuid

from edgeserve.engine.client import EngineClient
from edgeserve.engine.types import EngineStats, GenerationRequest, SamplingParams, TextDelta
from tests.integration.engine_idle import assert_engine_idle

EOG_BAN = {1: -100.0, 106: -100.0, 212: -100.0}
N = 4
MAX_TOKENS = 16


async def answer(engine, prompt: str, n: int, max_tokens: int) -> tuple[int, list[EngineStats]]:
    """Run an n-choice answer: its prompt's tokens, and the engine's stats at each text."""
    params = SamplingParams(max_tokens=max_tokens, temperature=1.0, logit_bias=EOG_BAN)
    seen: list[EngineStats] = []
    async with EngineClient(engine).generate(GenerationRequest(prompt, params, n=n)) as gen:
        info = await gen.submit()
        async for event in gen.events():
            if isinstance(event, TextDelta):
                seen.append(engine.stats())
    return info.prompt_tokens, seen


async def test_choices_hold_their_shared_prompt_once(engine):
    await assert_engine_idle(engine)
    # Every sequence first holds a short answer's cells: the choices below then take
    # sequences that held cells, which must be emptied before they share the prompt's.
    await answer(engine, f"{uuid.uuid4()} Hello", n=engine.config.parallel, max_tokens=4)
    await assert_engine_idle(engine)
    # A start no cached prompt shares (a uuid alone may share its first characters' tokens with
    # the answers' above): only BOS can be reused from the prompt cache.
    prompt = (
        f"Census of cells {uuid.uuid4()} " + "The quick brown fox jumps over the lazy dog. " * 60
    )
    n_prompt, seen = await answer(engine, prompt, n=N, max_tokens=MAX_TOKENS)
    assert N * n_prompt > engine.config.n_ctx  # the prompt four times would not fit
    assert all(s.kv_cells_used <= s.n_ctx for s in seen), "kv_cache_usage_ratio over 1"
    # While the four choices run, the cells beyond the free sequences' prompt cache are the
    # prompt once and each choice's tokens so far: at most MAX_TOKENS each, never the prompt
    # four times (a few cells of slack: a BOS, or a token or two, reused from a cache other
    # sequences share).
    running = [s.kv_cells_used - s.prefix_cache_cells for s in seen if s.busy_slots == N]
    assert running, "no snapshot while the choices ran"
    assert all(n_prompt - 4 <= cells <= n_prompt + N * MAX_TOKENS + 1 for cells in running), (
        n_prompt,
        running,
    )
    await assert_engine_idle(engine)
