"""Engine features the HTTP layer builds on: grammars, token log-probabilities and the
described tokens of a scored prompt."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import pytest

from edgeserve.engine.client import EngineClient
from edgeserve.engine.types import (
    ChatPrompt,
    ChatTurn,
    Finished,
    GenerationRequest,
    GrammarSpec,
    SamplingParams,
    ScoreRequest,
    TextDelta,
    TokenLogprob,
)
from edgeserve.errors import InvalidPrompt

ASK = ChatPrompt(messages=(ChatTurn("user", "Describe a cat as JSON."),))
EOG_BAN = {1: -100.0, 106: -100.0, 212: -100.0}


async def run(engine, params: SamplingParams) -> tuple[str, list[TokenLogprob], str]:
    text, logprobs, reason = "", [], ""
    async with EngineClient(engine).generate(GenerationRequest(ASK, params)) as gen:
        await gen.submit()
        async for event in gen.events():
            if isinstance(event, TextDelta):
                text += event.text
            elif isinstance(event, TokenLogprob):
                logprobs.append(event)
            else:
                assert isinstance(event, Finished)
                reason = event.reason
    return text, logprobs, reason


async def test_json_schema_grammar_output_parses_and_validates(engine):
    schema = {
        "type": "object",
        "properties": {"name": {"type": "string", "maxLength": 12}, "age": {"type": "integer"}},
        "required": ["name", "age"],
        "additionalProperties": False,
    }
    params = SamplingParams(
        max_tokens=60, temperature=0, grammar=GrammarSpec("json_schema", json.dumps(schema))
    )
    text, _, reason = await run(engine, params)
    assert reason == "stop", text
    value = json.loads(text)
    assert set(value) == {"name", "age"}
    assert isinstance(value["name"], str) and isinstance(value["age"], int)


async def test_json_object_grammar(engine):
    params = SamplingParams(max_tokens=80, temperature=0, grammar=GrammarSpec("json_object"))
    text, _, reason = await run(engine, params)
    if reason == "stop":
        assert isinstance(json.loads(text), dict)
    else:
        assert text.lstrip().startswith("{")


@pytest.mark.parametrize(
    "spec",
    [GrammarSpec("gbnf", "root ::= ("), GrammarSpec("json_schema", '{"type": "nonsense"}')],
)
async def test_bad_grammars_are_rejected_before_generation(engine, spec):
    params = SamplingParams(max_tokens=4, grammar=spec)
    with pytest.raises(InvalidPrompt):
        async with EngineClient(engine).generate(GenerationRequest(ASK, params)) as gen:
            await gen.submit()


async def test_token_logprobs_are_normalised_and_ranked(engine):
    params = SamplingParams(max_tokens=6, temperature=0, logprobs=3, logit_bias={1: -100.0})
    text, logprobs, _ = await run(engine, params)
    assert len(logprobs) == 6
    assert b"".join(lp.token for lp in logprobs).decode("utf-8", "replace").startswith(text[:1])
    for lp in logprobs:
        assert lp.logprob <= 0.0
        assert len(lp.top) == 3
        values = [v for _, v in lp.top]
        assert values == sorted(values, reverse=True)
        assert sum(math.exp(v) for v in values) <= 1.0 + 1e-6
        assert lp.logprob == pytest.approx(values[0], abs=1e-6), "greedy picks the top token"


async def test_scored_tokens_are_described_with_alternatives(engine):
    texts = ("The cat sat on the mat.", "Zürich 😀")
    client = EngineClient(engine)
    plain = await client.score(ScoreRequest(texts, return_token_logprobs=True))
    described = await client.score(ScoreRequest(texts, top_logprobs=2))
    assert plain.tokens is None
    assert described.scores == plain.scores
    assert described.tokens is not None
    for text, details, values in zip(texts, described.tokens, plain.token_logprobs, strict=True):
        assert [d.logprob for d in details] == list(values)
        assert [d.index for d in details] == list(range(1, len(details) + 1)), "BOS is 0"
        assert b"".join(d.token for d in details).decode() == text
        for d in details:
            (first, best), (second, runner_up) = d.top
            assert best >= runner_up
            assert d.logprob <= best + 1e-6
            if d.token not in (first, second):
                assert d.logprob <= runner_up + 1e-6, "a token outside the top 2 ranks below it"


async def test_grammar_with_no_possible_token_ends_the_choice_not_the_process(engine):
    # No Gemma token produces U+0000, so nothing fits this grammar: the choice ends cleanly
    # (accepting a refused token would make llama.cpp abort the whole process).
    params = SamplingParams(
        max_tokens=4, temperature=0, grammar=GrammarSpec("gbnf", 'root ::= "\\x00"')
    )
    text, _, reason = await run(engine, params)
    assert (text, reason) == ("", "stop")
    _, _, reason = await run(engine, SamplingParams(max_tokens=2, temperature=0))
    assert reason == "length", "the engine still serves"


@pytest.mark.parametrize("temperature", [0.0, 0.8])
async def test_lazily_applied_grammar_still_binds_every_token(engine, temperature):
    digits = GrammarSpec("gbnf", 'root ::= [0-9] [0-9] [0-9] "-" [a-c]+')
    params = SamplingParams(
        max_tokens=12,
        temperature=temperature,
        seed=3,
        grammar=digits,
        logit_bias=EOG_BAN,
    )
    text, _, _ = await run(engine, params)
    assert text[:3].isdigit() and text[3] == "-", text
    assert set(text[4:]) <= set("abc"), text


async def test_an_answer_whose_grammar_steps_turn_slow_is_ended(engine, monkeypatch):
    # A limit of 0 s makes every grammar step "slow": the answer ends after its first token.
    backend = engine.backend
    monkeypatch.setattr(backend, "config", replace(backend.config, grammar_step_limit_s=0.0))
    digits = GrammarSpec("gbnf", "root ::= [0-9]+")
    params = SamplingParams(max_tokens=8, temperature=0, grammar=digits, logit_bias=EOG_BAN)
    text, _, reason = await run(engine, params)
    assert (reason, len(text)) == ("length", 1) and text.isdigit(), "Gemma digits are 1 token"
    monkeypatch.undo()
    text, _, reason = await run(engine, params)
    assert reason == "length" and text.isdigit() and len(text) >= 8, "no limit hit normally"
