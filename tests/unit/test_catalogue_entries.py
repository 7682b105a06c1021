"""The catalogue's entries (catalogue/entries.py, config/presets.py): a models folder in
llama-server's layout, `[models.NAME]` tables, the settings that turn the catalogue on, and the
parsers of `keep_alive` and memory sizes; the GGUF header reader and the footprint estimate on
the real default model."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from edgeserve.catalogue.entries import build_catalogue, scan_models_dir
from edgeserve.catalogue.footprint import estimate
from edgeserve.catalogue.gguf_header import ArrayLength, GgufError, read_metadata
from edgeserve.config import ConfigError, load_settings
from edgeserve.config import values as v
from edgeserve.engine.types import EngineConfig


def touch(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"")
    return path


def test_a_file_is_a_model_and_a_folder_is_a_model_with_its_projector(tmp_path):
    touch(tmp_path / "qwen.gguf")
    touch(tmp_path / "mmproj-stray.gguf")  # a projector at the top is no model
    touch(tmp_path / "big-00001-of-00002.gguf")
    touch(tmp_path / "big-00002-of-00002.gguf")
    touch(tmp_path / "vision" / "model-q4.gguf")
    touch(tmp_path / "vision" / "mmproj-f16.gguf")
    touch(tmp_path / "empty" / "notes.txt")
    touch(tmp_path / "readme.md")
    found = scan_models_dir(tmp_path)
    assert found == {
        "big": (tmp_path / "big-00001-of-00002.gguf", None),
        "qwen": (tmp_path / "qwen.gguf", None),
        "vision": (tmp_path / "vision" / "model-q4.gguf", tmp_path / "vision" / "mmproj-f16.gguf"),
    }


def write_config(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "edgeserve.toml"
    path.write_text(text)
    return path


def test_presets_override_the_server_settings_and_take_paths_relative_to_the_file(tmp_path):
    touch(tmp_path / "m" / "chat.gguf")
    touch(tmp_path / "m" / "other.gguf")
    config = write_config(
        tmp_path,
        """
ctx-size = 1024
[models.chat]
model = "m/chat.gguf"
ctx-size = 8192
aliases = ["default", "c"]
keep-alive = "10m"
pinned = true
[models.other]
path = "m/other.gguf"
keep_alive = -1
""",
    )
    settings = load_settings(["--config", str(config)], {})
    assert settings.catalogue and settings.model == ""
    catalogue = build_catalogue(settings)
    chat, other = catalogue.entries["chat"], catalogue.entries["other"]
    assert chat.config.model_path == str(tmp_path / "m" / "chat.gguf")
    assert (chat.config.n_ctx, other.config.n_ctx) == (8192, 1024)
    assert chat.aliases == ("default", "c") and chat.keep_alive == 600.0 and chat.pinned
    assert other.keep_alive == math.inf and not other.pinned
    assert catalogue.resolve("c") is chat and catalogue.resolve("chat") is chat
    assert catalogue.resolve("gpt-4o") is None


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("[models.a]\nctx-size = 1024\n", "needs model = PATH"),
        ('[models.a]\nmodel = "missing.gguf"\n', "model file not found"),
        ('[models.a]\nmodel = "x.gguf"\nport = 1\n', "not a per-model setting"),
        ('[models.a]\nmodel = "x.gguf"\nkeep-alive = "soon"\n', "duration like 5m"),
        ("models = 3\n", "table of [models.NAME] tables"),
    ],
)
def test_a_bad_preset_is_a_clear_config_error(tmp_path, text, error):
    touch(tmp_path / "x.gguf")
    config = write_config(tmp_path, text)
    with pytest.raises(ConfigError, match=error.replace("[", r"\[").replace("]", r"\]")):
        load_settings(["--config", str(config)], {})


def test_model_alone_is_the_single_model_server_that_takes_any_name(tmp_path):
    model = touch(tmp_path / "one.gguf")
    settings = load_settings(["--model", str(model)], {})
    catalogue = build_catalogue(settings)
    assert not settings.catalogue and catalogue.single and catalogue.ids() == ["one"]
    assert catalogue.resolve("anything").id == catalogue.resolve(None).id == "one"


def test_model_with_a_folder_is_one_entry_among_them_and_keeps_its_attachments(tmp_path):
    model = touch(tmp_path / "main.gguf")
    touch(tmp_path / "dir" / "side.gguf")
    adapter = touch(tmp_path / "a.gguf")
    settings = load_settings(
        ["--model", str(model), "--models-dir", str(tmp_path / "dir"), "--lora", f"a={adapter}"],
        {},
    )
    catalogue = build_catalogue(settings)
    assert catalogue.ids() == ["main", "side"] and not catalogue.single
    assert catalogue.entries["main"].config.lora_adapters == (("a", str(adapter)),)
    assert catalogue.entries["side"].config.lora_adapters == ()
    assert catalogue.entries["main"].load_at_start and catalogue.entries["main"].pinned


def test_a_missing_models_folder_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="models folder not found"):
        load_settings(["--models-dir", str(tmp_path / "nope")], {})


@pytest.mark.parametrize(
    ("raw", "seconds"),
    [(300, 300.0), ("5m", 300.0), ("1h30m", 5400.0), ("90s", 90.0), ("250ms", 0.25),
     ("0", 0.0), (0, 0.0), (-1, math.inf), ("-1m", math.inf), ("2.5", 2.5)],
)  # fmt: skip
def test_keep_alive_reads_ollama_s_values(raw, seconds):
    assert v.keep_alive(raw) == seconds


@pytest.mark.parametrize("raw", ["", "soon", "5x", "5m3", True, None, [5]])
def test_keep_alive_refuses_what_is_not_a_duration(raw):
    with pytest.raises(ValueError):
        v.keep_alive(raw)


@pytest.mark.parametrize(
    ("raw", "size"),
    [("8G", 8 * 2**30), ("512MiB", 512 * 2**20), ("1.5GB", 1_500_000_000), (4096, 4096),
     ("100 mb", 100_000_000)],
)  # fmt: skip
def test_memory_sizes(raw, size):
    assert v.byte_size(raw) == size


@pytest.mark.parametrize("raw", ["8X", "-1G", 0, "lots", True])
def test_bad_memory_sizes(raw):
    with pytest.raises(ValueError):
        v.byte_size(raw)


def test_the_header_reader_agrees_with_gguf_s_own(tmp_path):
    # A header holding every GGUF value type, written and read back by the gguf package (the
    # real model's 262,144-token vocabulary takes its reader 13 s).
    import gguf
    import numpy as np

    path = tmp_path / "types.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_uint8("t.u8", 7)
    writer.add_int8("t.i8", -7)
    writer.add_uint16("t.u16", 65000)
    writer.add_int16("t.i16", -32000)
    writer.add_uint32("t.u32", 4_000_000_000)
    writer.add_int32("t.i32", -2_000_000_000)
    writer.add_float32("t.f32", 0.5)
    writer.add_uint64("t.u64", 2**63 + 5)
    writer.add_int64("t.i64", -(2**62))
    writer.add_float64("t.f64", -1.25)
    writer.add_bool("t.bool", True)
    writer.add_string("t.str", "héllo")
    writer.add_array("t.ints", [1, 2, 3])
    writer.add_array("t.strs", ["a", "bc", ""])
    writer.add_tensor("w", np.zeros((4,), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()

    ours = read_metadata(path)
    theirs = gguf.GGUFReader(path)
    assert set(ours) == set(theirs.fields) - {"GGUF.version", "GGUF.tensor_count", "GGUF.kv_count"}
    for key, field in theirs.fields.items():
        if key.startswith("GGUF."):
            continue
        if field.types[0] == gguf.GGUFValueType.ARRAY:
            assert isinstance(ours[key], ArrayLength) and ours[key] == len(field.data), key
        else:
            assert ours[key] == field.contents(), key


def test_the_header_reader_reads_the_default_model(model_path):
    ours = read_metadata(model_path)
    assert ours["gemma3.block_count"] == 18 and ours["general.architecture"] == "gemma3"
    assert ours["gemma3.context_length"] == 32768
    assert isinstance(ours["tokenizer.ggml.tokens"], ArrayLength)
    assert ours["tokenizer.ggml.tokens"] == 262144


def test_the_header_reader_refuses_what_is_not_gguf(tmp_path):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF\x03\x00\x00\x00" + b"\x00" * 8 + b"\xff" * 8)
    with pytest.raises(GgufError):
        read_metadata(bad)
    bad.write_bytes(b"not a model")
    with pytest.raises(GgufError):
        read_metadata(bad)


def test_the_footprint_grows_with_the_context_and_the_sequences(model_path):
    small = estimate(EngineConfig(model_path=str(model_path), n_ctx=1024, parallel=1))
    large = estimate(EngineConfig(model_path=str(model_path), n_ctx=8192, parallel=8))
    assert small.weights == large.weights == model_path.stat().st_size
    # Gemma 3 270M: 18 layers x 1 KV head x (256 + 256) x 2 bytes = 18 KiB a cell.
    assert small.kv == 1024 * 18 * 1024 and large.kv == 8 * small.kv
    assert large.compute > small.compute


def test_the_footprint_counts_the_prompt_caches_memory_tier(model_path):
    without = estimate(EngineConfig(model_path=str(model_path)))
    cached = estimate(EngineConfig(model_path=str(model_path), prompt_cache_ram=300 * 2**20))
    assert cached.prompt_cache == 300 * 2**20
    assert cached.total == without.total + 300 * 2**20
