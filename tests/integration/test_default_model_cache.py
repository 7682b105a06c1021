"""The real `edgeserve[model]` extra assembled into an empty cache, then reused."""

from __future__ import annotations

import hashlib
import importlib

from edgeserve.default_model import FILE, PACKAGE, cached_model


def test_the_extra_is_assembled_once_into_the_cache(tmp_path, model_path, capsys):
    try:
        package = importlib.import_module(PACKAGE)
    except ImportError as exc:
        raise RuntimeError(f"{PACKAGE} is missing: run `make model` (make test does it)") from exc
    env = {"EDGESERVE_HOME": str(tmp_path)}
    target = tmp_path / "models" / FILE
    assert cached_model(env) == target
    assert capsys.readouterr().err.count("assembling the default model") == 1
    with target.open("rb") as fh:
        assert hashlib.file_digest(fh, "sha256").hexdigest() == package.EXPECTED_SHA256
    assert target.stat().st_size == model_path.stat().st_size
    assembled_at = target.stat().st_mtime_ns
    assert cached_model(env) == target
    assert target.stat().st_mtime_ns == assembled_at
    assert capsys.readouterr().err == ""
    assert sorted(p.name for p in target.parent.iterdir()) == [FILE]
