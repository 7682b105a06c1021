"""The grammar-constrained sampler on the real vocabulary with made-up logit rows: whichever
path finds the token (the chain's own choice, a grammar pass over the likeliest candidates,
draws from the accepted head and the tail, or the full filter), the token is one the grammar
accepts, drawn from the model's distribution restricted to those tokens; greedy takes the best
of them. Seeded, so every run draws the same tokens."""

from __future__ import annotations

import ctypes
import math
from collections import Counter
from collections.abc import Callable

import llama_cpp as lc
import numpy as np
import pytest

from edgeserve.engine.llama.sampling import HEADS, Sampler
from edgeserve.engine.types import SamplingParams
from tests.grammar_check import GrammarCheck

LETTERS = "abcde"
GBNF = f"root ::= [{LETTERS[0]}-{LETTERS[-1]}]"
DRAWS = 200
POPULAR = 100


@pytest.fixture(scope="session")
def letter_of(grammar_check: GrammarCheck) -> dict[int, str]:
    """Every token whose text is exactly one of LETTERS (a plain and a byte token each)."""
    found = {}
    piece = ctypes.create_string_buffer(64)
    for token in range(grammar_check.n_vocab):
        size = lc.llama_token_to_piece(grammar_check.vocab, token, piece, len(piece), 0, False)
        if size == 1 and piece.raw[:1].decode("latin-1") in LETTERS:
            found[token] = piece.raw[:1].decode()
    assert set(found.values()) == set(LETTERS)
    return found


def row(
    n_vocab: int, letter_of: dict[int, str], letters: dict[str, float], crowd: int
) -> np.ndarray:
    """A logit row: -10 everywhere, `crowd` refused tokens at +3 (in front of the letters when
    crowd > HEADS[0]), and each letter's tokens at the logit given."""
    logits = np.full(n_vocab, -10.0, dtype=np.float32)
    refused = [t for t in range(1000, n_vocab) if t not in letter_of][:crowd]
    logits[refused] = 3.0
    for token, letter in letter_of.items():
        logits[token] = letters[letter]
    return logits


SCENARIOS: dict[str, Callable[[int, dict[int, str]], np.ndarray]] = {
    # the letters carry most of the mass: the chain's own choice is usually accepted
    "likely": lambda n, lo: row(n, lo, dict(zip(LETTERS, [9, 8, 8, 7, 6], strict=True)), POPULAR),
    # 0.2% of the mass, all in the first head: drawn from the accepted head
    "in the head": lambda n, lo: row(n, lo, dict.fromkeys(LETTERS, 0.0) | {"a": 1.0}, POPULAR),
    # behind more refused tokens than the first head holds: found by the second
    "behind the first head": lambda n, lo: row(
        n, lo, dict(zip(LETTERS, [2.5, 2.0, 2.0, 1.0, 0.5], strict=True)), HEADS[0] + 500
    ),
}


def draw(vocab: GrammarCheck, logits: np.ndarray, seed: int, temperature: float = 1.0) -> int:
    params = SamplingParams(seed=seed, temperature=temperature)
    sampler = Sampler(params, vocab.vocab, None, vocab.n_vocab, gbnf=GBNF)
    try:
        token = sampler.sample_logits(logits)
    finally:
        sampler.free()
    assert token is not None
    return token


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_sampled_tokens_follow_the_restricted_distribution(grammar_check, letter_of, scenario):
    logits = SCENARIOS[scenario](grammar_check.n_vocab, letter_of)
    weights = Counter()
    for token, letter in letter_of.items():
        weights[letter] += math.exp(float(logits[token]))
    total = sum(weights.values())
    drawn = [draw(grammar_check, logits, seed) for seed in range(DRAWS)]
    assert all(token in letter_of for token in drawn), "a token the grammar refuses"
    counts = Counter(letter_of[token] for token in drawn)
    for letter in LETTERS:
        expected = weights[letter] / total
        spread = 4.5 * math.sqrt(expected * (1 - expected) / DRAWS) + 1 / DRAWS
        assert abs(counts[letter] / DRAWS - expected) <= spread, (letter, counts, expected)


def test_only_the_full_filter_finds_letters_in_the_deep_tail(grammar_check, letter_of):
    logits = row(grammar_check.n_vocab, letter_of, dict.fromkeys(LETTERS, -11.0), HEADS[-1] + 500)
    assert all(draw(grammar_check, logits, seed) in letter_of for seed in range(5))


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_greedy_takes_the_best_accepted_token(grammar_check, letter_of, scenario):
    logits = SCENARIOS[scenario](grammar_check.n_vocab, letter_of)
    best = max(letter_of, key=lambda token: (logits[token], -token))
    assert draw(grammar_check, logits, seed=0, temperature=0.0) == best
