"""The longest-piece scan behind the early context check (`prepare.at_least_tokens`: a prompt
of B bytes has at least B / the longest token's bytes tokens) is read while the engine is idle,
a slice at a time (vocab.py), so that the first long prompt after a load does not wait for a
whole vocabulary (~0.35 s on Gemma 3's 262k tokens, 2 cores)."""

from __future__ import annotations

import ctypes
import random
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import llama_cpp.llama_cpp as lc
import pytest

from edgeserve.engine.llama.vocab import Vocabulary
from tests.conftest import running_engine


@pytest.fixture(scope="module")
def gemma_vocab(model_path: Path) -> Iterator[Any]:
    """The default model's vocabulary alone (no weights)."""
    params = lc.llama_model_default_params()
    params.vocab_only = True
    model = lc.llama_model_load_from_file(str(model_path).encode(), params)
    assert model
    yield lc.llama_model_get_vocab(model)
    lc.llama_model_free(model)


@pytest.fixture(scope="module")
def longest(gemma_vocab: Any) -> int:
    """The longest piece of any token, special tokens as text: the scan written out."""
    buf = ctypes.create_string_buffer(1024)
    tokens = range(lc.llama_vocab_n_tokens(gemma_vocab))
    return max(abs(lc.llama_token_to_piece(gemma_vocab, t, buf, 1024, 0, True)) for t in tokens)


def test_the_scan_gives_the_longest_piece_however_it_is_sliced(gemma_vocab, longest):
    rng = random.Random(7)
    for _ in range(3):
        vocab = Vocabulary(gemma_vocab)
        # Slices of any size, the scan left unfinished at a random point: the prompt that
        # needs the figure reads the rest.
        while vocab.pieces_unscanned and rng.random() < 0.85:
            vocab.scan_pieces(rng.choice([1, 7, 4096, 60_000]))
        assert vocab.max_piece_bytes() == longest
        assert not vocab.pieces_unscanned


def test_a_loaded_engine_reads_the_pieces_while_idle(model_path, longest):
    with running_engine(model_path, parallel=1) as engine:
        deadline = time.monotonic() + 60
        while engine.backend.idle_work_left:
            assert time.monotonic() < deadline, "the idle engine left the vocabulary unscanned"
            time.sleep(0.05)
        assert engine.backend.max_piece_bytes == longest
