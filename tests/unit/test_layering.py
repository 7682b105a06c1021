"""Imports flow one way: cli → http → {validation, responses} → {protocol, engine}."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "edgeserve"

FORBIDDEN = {
    "engine": (
        "aiohttp",
        "edgeserve.http",
        "edgeserve.protocol",
        "edgeserve.validation",
        "edgeserve.responses",
        "edgeserve.config",
        "edgeserve.cli",
    ),
    "protocol": ("aiohttp", "llama_cpp", "edgeserve.http", "edgeserve.engine.worker"),
    "validation": ("aiohttp", "llama_cpp", "edgeserve.http"),
    "responses.py": ("aiohttp", "llama_cpp", "edgeserve.http"),
    "messages.py": ("aiohttp", "llama_cpp", "edgeserve.http", "edgeserve.validation"),
    "errors.py": ("aiohttp", "llama_cpp", "pydantic", "edgeserve."),
    "tool_calls.py": ("aiohttp", "llama_cpp", "pydantic", "edgeserve."),
    "tool_stream.py": (
        "aiohttp",
        "llama_cpp",
        "pydantic",
        "edgeserve.http",
        "edgeserve.engine",
        "edgeserve.protocol",
        "edgeserve.validation",
        "edgeserve.responses",
    ),
    "grammars.py": ("aiohttp", "pydantic", "edgeserve."),
    "logprobs.py": (
        "aiohttp",
        "llama_cpp",
        "pydantic",
        "edgeserve.http",
        "edgeserve.protocol",
        "edgeserve.engine.worker",
    ),
    "metrics.py": ("aiohttp", "llama_cpp", "edgeserve.http", "edgeserve.engine.worker"),
    "sdnotify.py": ("aiohttp", "llama_cpp", "edgeserve.http", "edgeserve.engine"),
}


def imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


@pytest.mark.parametrize("part", sorted(FORBIDDEN))
def test_layer_imports(part):
    target = PACKAGE / part
    files = sorted(target.rglob("*.py")) if target.is_dir() else [target]
    assert files
    for path in files:
        for name in imports(path):
            bad = [f for f in FORBIDDEN[part] if name == f.rstrip(".") or name.startswith(f)]
            assert not bad, f"{path.relative_to(PACKAGE)} imports {name}"


def test_only_http_imports_aiohttp():
    for path in PACKAGE.rglob("*.py"):
        if "http" in path.relative_to(PACKAGE).parts:
            continue
        assert not any(n.split(".")[0] == "aiohttp" for n in imports(path)), path
