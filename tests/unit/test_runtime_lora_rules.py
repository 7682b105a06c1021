"""RuntimeLoading (engine/adapters.py): which files and names a runtime LoRA load may take, on
real files and symlinks in a temporary folder (no model: the catalog is filled by hand)."""

from __future__ import annotations

from pathlib import Path

import pytest

from edgeserve.engine.adapters import AdapterCatalog, RuntimeLoading
from edgeserve.engine.types import EngineConfig
from edgeserve.errors import AdapterRefused


@pytest.fixture
def tree(tmp_path) -> dict[str, Path]:
    """adapters/ (a.gguf, b.gguf, a symlink to a.gguf, one out, a sub-folder) and outside/."""
    inside, outside = tmp_path.resolve() / "adapters", tmp_path.resolve() / "outside"
    (inside / "sub").mkdir(parents=True)
    outside.mkdir()
    for path in (inside / "a.gguf", inside / "b.gguf", inside / "sub" / "c.gguf"):
        path.write_bytes(b"GGUF")
    (outside / "x.gguf").write_bytes(b"GGUF")
    (inside / "link-a.gguf").symlink_to(inside / "a.gguf")
    (inside / "link-out.gguf").symlink_to(outside / "x.gguf")
    return {"inside": inside, "outside": outside}


def rules(folder: Path, limit: int = 8) -> RuntimeLoading:
    return RuntimeLoading.of(
        EngineConfig(model_path="m.gguf", lora_dir=str(folder), max_loras=limit)
    )


def refused(rules: RuntimeLoading, catalog: AdapterCatalog, name: str, path: str) -> AdapterRefused:
    with pytest.raises(AdapterRefused) as caught:
        rules.admit(catalog, name, path)
    return caught.value


def test_the_folder_is_lora_dir_else_the_folders_of_the_lora_files_else_none(tmp_path, tree):
    (tmp_path / "via").symlink_to(tree["inside"])
    startup = (("a", str(tree["inside"] / "a.gguf")), ("x", str(tree["outside"] / "x.gguf")))
    config = EngineConfig(model_path="m.gguf", lora_adapters=startup, max_loras=3)
    assert RuntimeLoading.of(config) == RuntimeLoading(
        (str(tree["inside"]), str(tree["outside"])), 3
    )
    chosen = EngineConfig(
        model_path="m.gguf", lora_adapters=startup, lora_dir=str(tmp_path / "via")
    )
    assert RuntimeLoading.of(chosen).folders == (str(tree["inside"]),)  # its real path
    assert RuntimeLoading.of(EngineConfig(model_path="m.gguf")).folders == ()


def test_files_in_the_folder_load_by_absolute_or_relative_path_as_their_real_path(tree):
    inside = tree["inside"]
    catalog = AdapterCatalog()
    loading = rules(inside)
    assert loading.admit(catalog, "a", str(inside / "a.gguf")) == str(inside / "a.gguf")
    assert loading.admit(catalog, "a", "sub/c.gguf") == str(inside / "sub" / "c.gguf")
    assert loading.admit(catalog, "a", "sub/../link-a.gguf") == str(inside / "a.gguf")


@pytest.mark.parametrize(
    "path",
    [
        "{outside}/x.gguf",
        "../outside/x.gguf",
        "{inside}/../outside/x.gguf",
        "link-out.gguf",  # a symlink in the folder to a file outside it
        "{outside}/missing.gguf",  # refused as outside, before anything says it is missing
        "/etc/passwd",
        "/",
        "..",
        "a.gguf\0",
    ],
)
def test_every_path_whose_real_path_leaves_the_folder_is_refused(tree, path):
    sent = path.format(**tree)
    refusal = refused(rules(tree["inside"]), AdapterCatalog(), "n", sent)
    assert (refusal.rule, refusal.path) == ("outside_folder", sent)


def test_without_a_folder_every_path_is_refused(tree):
    loading = RuntimeLoading.of(EngineConfig(model_path="m.gguf"))
    refusal = refused(loading, AdapterCatalog(), "n", str(tree["inside"] / "a.gguf"))
    assert refusal.rule == "no_folder"


@pytest.mark.parametrize("path", ["missing.gguf", "sub", "."])
def test_what_is_no_file_in_the_folder_is_refused(tree, path):
    assert refused(rules(tree["inside"]), AdapterCatalog(), "n", path).rule == "not_a_file"


def test_a_taken_name_a_loaded_file_and_a_full_catalog_are_refused(tree):
    inside = tree["inside"]
    catalog = AdapterCatalog()
    catalog.add("first", str(inside / "link-a.gguf"))  # kept as its real path, a.gguf
    loading = rules(inside, limit=2)
    assert refused(loading, catalog, "first", "b.gguf").rule == "name_taken"
    for sent in ("a.gguf", "link-a.gguf", str(inside / "sub" / ".." / "a.gguf")):
        refusal = refused(loading, catalog, "again", sent)
        assert (refusal.rule, refusal.path, refusal.loaded_as) == ("file_loaded", sent, "first")
    catalog.add("second", loading.admit(catalog, "second", "b.gguf"))
    full = refused(loading, catalog, "third", "sub/c.gguf")
    assert (full.rule, full.limit) == ("full", 2)
    catalog.remove("first")
    assert loading.admit(catalog, "third", "sub/c.gguf") == str(inside / "sub" / "c.gguf")
