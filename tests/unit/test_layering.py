"""Imports flow one way: cli → http → api/<one API> → {api/common, api/reference} → engine."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "edgeserve"

API_PACKAGES = (
    "anthropic_messages",
    "embeddings",
    "models",
    "openai_chat",
    "openai_completions",
    "openai_responses",
    "score",
    "tokenize",
)
"""One package per wire API; none imports another, except the Responses API, which is
translated to a chat request (README "Layout")."""
ALLOWED_BETWEEN_APIS = {("openai_responses", "openai_chat")}

FORBIDDEN = {
    "engine": (
        "aiohttp",
        "edgeserve.http",
        "edgeserve.api",
        "edgeserve.config",
        "edgeserve.cli",
    ),
    "api": ("aiohttp", "llama_cpp", "edgeserve.http", "edgeserve.engine.worker"),
    "api/reference": ("edgeserve.api.common", *(f"edgeserve.api.{name}" for name in API_PACKAGES)),
    "api/common": tuple(f"edgeserve.api.{name}" for name in API_PACKAGES),
    "errors.py": ("aiohttp", "llama_cpp", "pydantic", "edgeserve."),
    "grammars.py": ("aiohttp", "pydantic", "edgeserve."),
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


@pytest.mark.parametrize("api", API_PACKAGES)
def test_api_packages_do_not_import_each_other(api):
    for path in sorted((PACKAGE / "api" / api).rglob("*.py")):
        for name in imports(path):
            parts = name.split(".")
            if parts[:2] != ["edgeserve", "api"] or len(parts) < 3:
                continue
            other = parts[2]
            if other in API_PACKAGES and other != api:
                assert (api, other) in ALLOWED_BETWEEN_APIS, (
                    f"{path.relative_to(PACKAGE)} imports {name}"
                )
