"""The default model's cache: where it is, assembling once, reuse, and interrupted assemblies.

`FakeModelPackage` stands in for the `edgeserve[model]` chunk packages (pure file logic); the
real package is assembled by tests/integration/test_default_model_cache.py.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from edgeserve import default_model
from edgeserve.default_model import FILE, PACKAGE, AssembleError, cache_dir, cached_model


class FakeModelPackage:
    """The chunk package's API: `chunk_paths()` and `assemble(path, overwrite=)`."""

    def __init__(self, chunk_dir: Path) -> None:
        chunk_dir.mkdir()
        self.chunks = []
        for i, data in enumerate((b"GGUF" + b"a" * 10, b"b" * 7)):
            chunk = chunk_dir / f"part{i}"
            chunk.write_bytes(data)
            self.chunks.append(chunk)
        self.assembled: list[Path] = []
        self.fail_after: int | None = None

    def chunk_paths(self) -> list[Path]:
        return self.chunks

    def assemble(self, output_path: Path, overwrite: bool = False) -> Path:
        assert overwrite
        self.assembled.append(output_path)
        data = b"".join(chunk.read_bytes() for chunk in self.chunks)
        if self.fail_after is not None:  # the sha256 check failed halfway, or the disk filled
            output_path.write_bytes(data[: self.fail_after])
            raise ValueError("Assembled file sha256 did not match expected value")
        output_path.write_bytes(data)
        return output_path


@pytest.fixture
def package(tmp_path, monkeypatch) -> FakeModelPackage:
    fake = FakeModelPackage(tmp_path / "chunks")
    monkeypatch.setitem(sys.modules, PACKAGE, fake)
    return fake


@pytest.fixture
def env(tmp_path) -> dict[str, str]:
    return {"EDGESERVE_HOME": str(tmp_path / "home")}


def test_cache_dir_precedence(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    assert cache_dir({}) == tmp_path / ".cache/edgeserve/models"
    assert cache_dir({"XDG_CACHE_HOME": "/xdg"}) == Path("/xdg/edgeserve/models")
    both = {"XDG_CACHE_HOME": "/xdg", "EDGESERVE_HOME": "/srv/edge"}
    assert cache_dir(both) == Path("/srv/edge/models")
    assert cache_dir({"EDGESERVE_HOME": " ", "XDG_CACHE_HOME": ""}) == cache_dir({})


def test_assembled_once_then_reused(package, env, tmp_path, capsys):
    target = tmp_path / "home" / "models" / FILE
    assert cached_model(env) == target
    assert target.read_bytes() == b"GGUF" + b"a" * 10 + b"b" * 7
    assert (
        capsys.readouterr().err == f"edgeserve: assembling the default model into {target} (once)\n"
    )
    assert cached_model(env) == target
    assert len(package.assembled) == 1
    assert capsys.readouterr().err == ""
    assert [p.name for p in target.parent.iterdir()] == [FILE]  # no partial file left


def test_an_incomplete_file_is_assembled_again(package, env, tmp_path):
    target = tmp_path / "home" / "models" / FILE
    target.parent.mkdir(parents=True)
    target.write_bytes(b"GGUF" + b"a" * 3)
    assert cached_model(env) == target
    assert len(package.assembled) == 1
    assert target.stat().st_size == 21


def test_an_interrupted_assembly_leaves_no_model(package, env, tmp_path):
    package.fail_after = 5
    target = tmp_path / "home" / "models" / FILE
    with pytest.raises(AssembleError) as caught:
        cached_model(env)
    assert str(caught.value).startswith(f"cannot assemble the default model into {target}: ")
    assert list(target.parent.iterdir()) == []  # neither the model nor the partial file
    package.fail_after = None
    assert cached_model(env) == target


def test_an_unwritable_cache_is_a_one_line_error(package, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(AssembleError, match=r"^cannot assemble the default model into .*: \["):
        cached_model({"EDGESERVE_HOME": str(blocker)})


def test_without_the_extra_only_an_existing_file_counts(env, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, PACKAGE, None)
    assert cached_model(env) is None
    target = tmp_path / "home" / "models" / FILE
    target.parent.mkdir(parents=True)
    target.write_bytes(b"GGUF")
    assert cached_model(env) == target
    assert default_model.cache_dir(env) == target.parent
