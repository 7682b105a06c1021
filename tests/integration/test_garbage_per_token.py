"""A stream leaves no reference cycles behind per token: the garbage collector would otherwise
run every few steps, and its older generations' passes (1-20 ms on a loaded server) land in
the middle of a stream as inter-token stalls."""

from __future__ import annotations

import gc

import pytest

from tests.integration.conftest import EOS_BAN
from tests.integration.engine_idle import assert_engine_idle

CHAT = "/v1/chat/completions"


async def garbage_of_one_stream(client, engine, max_tokens: int, sampling: dict) -> int:
    """The unreachable objects one streamed chat of `max_tokens` tokens leaves."""
    body = {
        "model": "m",
        "messages": [{"role": "user", "content": "Tell me about the sea."}],
        "max_tokens": max_tokens,
        "seed": 7,
        "logit_bias": EOS_BAN,
        "stream": True,
        **sampling,
    }
    gc.collect()
    gc.disable()  # nothing is collected behind the count's back
    try:
        resp = await client.post(CHAT, json=body)
        assert resp.status == 200
        text = await resp.text()
        assert text.rstrip().endswith("data: [DONE]")
        await assert_engine_idle(engine)
        return gc.collect()
    finally:
        gc.enable()


@pytest.mark.parametrize(
    "sampling",
    [{"temperature": 0.8}, {"temperature": 0.0}, {"temperature": 0.8, "top_p": 0.9}],
    ids=["sampled", "greedy", "llama.cpp-chain"],
)
async def test_a_longer_stream_leaves_no_more_garbage_than_a_short_one(client, engine, sampling):
    gc.collect()
    gc.freeze()  # the objects already there are neither counted nor walked again
    try:
        await garbage_of_one_stream(client, engine, 4, sampling)  # first-use work done
        # The fewest of two tries each: what else the server's loop runs meanwhile (a
        # connection an earlier test left, closing) can leave garbage of its own in one.
        short = min([await garbage_of_one_stream(client, engine, 8, sampling) for _ in range(2)])
        long = min([await garbage_of_one_stream(client, engine, 40, sampling) for _ in range(2)])
    finally:
        gc.unfreeze()
    # What a request leaves (its connection, its task) does not grow with its tokens; one
    # object a token would add 32.
    assert long - short < 16, (short, long)
