"""The tiny LoRA adapters (tests/fixtures/tiny_lora.py) on the default model, through
llama.cpp's own path (tests/fixtures/lora_reference.py): no server. A scale of 0 is the base
exactly, a scale of 1 changes the greedy answer, seeds give different adapters (and the same
seed the same bytes), alpha is read, and the bad files are refused for their own reasons; the
bench's LoRA workload (bench/lora.py) writes these same adapters."""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path

import gguf
import numpy as np
import pytest

from bench import lora
from tests.fixtures.lora_reference import (
    adapter_refusal,
    free_models,
    greedy,
    log_softmax_scores,
    tokenize,
)
from tests.fixtures.tiny_lora import write_bad_loras, write_lora

pytestmark = pytest.mark.needs_model

# A prompt whose greedy answer both seeds' adapters change from the first token.
PROMPT = "<start_of_turn>user\nList three colors.<end_of_turn>\n<start_of_turn>model\n"
N = 4


@pytest.fixture(scope="module")
def base(model_path: Path) -> Iterator[Path]:
    """The default model; llama.cpp's copy is freed after this module."""
    yield model_path
    free_models()


@pytest.fixture(scope="module")
def loras(base: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[int, Path]:
    directory = tmp_path_factory.mktemp("lora")
    return {seed: write_lora(directory / f"seed{seed}.gguf", base, seed=seed) for seed in (1, 2)}


@pytest.fixture(scope="module")
def prompt(base: Path) -> list[int]:
    return tokenize(base, PROMPT)


@pytest.fixture(scope="module")
def base_answer(base: Path, prompt: list[int]) -> list[int]:
    return greedy(base, [], prompt, N)[0]


def test_scale_zero_is_the_base(base, loras, prompt, base_answer):
    assert greedy(base, [(loras[1], 0.0)], prompt, N)[0] == base_answer
    assert log_softmax_scores(base, [(loras[1], 0.0)], prompt) == log_softmax_scores(
        base, [], prompt
    )


def test_scale_one_changes_the_answer(base, loras, prompt, base_answer):
    answer = greedy(base, [(loras[1], 1.0)], prompt, N)[0]
    assert answer != base_answer
    scores = log_softmax_scores(base, [(loras[1], 1.0)], prompt + answer)
    assert all(math.isfinite(score) and score <= 0 for score in scores)


def test_seeds_give_different_answers(base, loras, prompt):
    first = greedy(base, [(loras[1], 1.0)], prompt, N)[0]
    assert greedy(base, [(loras[2], 1.0)], prompt, N)[0] != first


def test_same_seed_same_bytes(base, loras, tmp_path):
    again = write_lora(tmp_path / "again.gguf", base, seed=1)
    assert again.read_bytes() == loras[1].read_bytes()
    first, second = (
        {t.name: t.data for t in gguf.GGUFReader(loras[seed]).tensors} for seed in (1, 2)
    )
    assert first.keys() == second.keys()
    assert not any(np.array_equal(first[name], second[name]) for name in first)


def test_alpha_scales_the_update(base, loras, prompt, tmp_path):
    """llama.cpp multiplies by scale * alpha / rank: alpha 8 at scale 0.5 is the default
    alpha (the rank, 4) at scale 1."""
    doubled = write_lora(tmp_path / "alpha8.gguf", base, seed=1, alpha=8.0)
    scores = log_softmax_scores(base, [(doubled, 0.5)], prompt)
    assert scores == log_softmax_scores(base, [(loras[1], 1.0)], prompt)
    assert scores != log_softmax_scores(base, [(loras[1], 0.5)], prompt)


def test_bad_files_are_refused(base, loras, tmp_path):
    reasons = {
        case: adapter_refusal(base, path) for case, path in write_bad_loras(tmp_path, base).items()
    }
    assert reasons == {
        "wrong_shape": "tensor 'blk.0.attn_q.weight' has incorrect shape "
        "(hint: maybe wrong base model?)",
        "other_arch": "model arch and LoRA arch mismatch",
        "not_adapter": "expect general.type to be 'adapter', but got: model",
        "unknown_tensor": "LoRA tensor 'blk.18.attn_q.weight' does not exist in base model "
        "(hint: maybe wrong base model?)",
    }
    assert adapter_refusal(base, loras[1]) is None


def test_the_benchs_adapters_are_these(base, loras, tmp_path):
    paths = lora.write_adapters(tmp_path / "lora", base)
    assert paths == [tmp_path / "lora" / "tiny-lora-a.gguf", tmp_path / "lora" / "tiny-lora-b.gguf"]
    assert all(2**19 < p.stat().st_size < 2**21 for p in paths)  # half a MiB to two
    assert [p.read_bytes() for p in paths] == [loras[seed].read_bytes() for seed in (1, 2)]
