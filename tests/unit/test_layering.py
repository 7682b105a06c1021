"""Imports flow one way: cli → http → api/<one API> → {api/common, api/reference} → engine;
inside the engine, the scheduling policy never reaches llama.cpp and the llama.cpp backend never
reaches the policy (checked over each module's import closure, not only its direct imports)."""

from __future__ import annotations

import ast
from collections import deque
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "edgeserve"

API_PACKAGES = (
    "anthropic_messages",
    "embeddings",
    "models",
    "ollama",
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
        "edgeserve.catalogue",
    ),
    "catalogue": ("aiohttp", "llama_cpp", "edgeserve.http", "edgeserve.api", "edgeserve.cli"),
    "api": ("aiohttp", "llama_cpp", "edgeserve.http", "edgeserve.engine.worker"),
    "api/reference": ("edgeserve.api.common", *(f"edgeserve.api.{name}" for name in API_PACKAGES)),
    "api/common": tuple(f"edgeserve.api.{name}" for name in API_PACKAGES),
    "errors.py": ("aiohttp", "llama_cpp", "pydantic", "edgeserve."),
    "grammars.py": ("aiohttp", "pydantic", "edgeserve."),
    "metrics.py": ("aiohttp", "llama_cpp", "edgeserve.http", "edgeserve.engine.worker"),
    "sdnotify.py": ("aiohttp", "llama_cpp", "edgeserve.http", "edgeserve.engine"),
}


def package_of(path: Path) -> list[str]:
    """The dotted package `path` belongs to, as parts (`edgeserve/http/app.py` → edgeserve,
    http); a package's `__init__.py` belongs to that package."""
    return list(path.relative_to(REPO).parent.parts)


def from_module(node: ast.ImportFrom, path: Path) -> str:
    """The absolute module a `from … import` in `path` reads from: a relative one (`from .x`,
    `from .. import y`) resolved against the file's package."""
    if not node.level:
        return node.module or ""
    package = package_of(path)
    if node.level > len(package):
        raise AssertionError(f"{path}: `from {'.' * node.level}` climbs out of the repository")
    base = package[: len(package) - node.level + 1]
    return ".".join([*base, *([node.module] if node.module else [])])


def from_names(node: ast.ImportFrom, path: Path) -> set[str]:
    """The modules a `from … import` names: the one it reads from, and `from . import x`'s
    `x` (a module of the package itself)."""
    module = from_module(node, path)
    if node.module is None:
        return {f"{module}.{alias.name}" for alias in node.names}
    return {module}


def imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            names.update(from_names(node, path))
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


# What a module must not reach through any chain of imports (run-time imports: those under
# `if TYPE_CHECKING:` are never executed). Paths are relative to the repository.
POLICY_SIDE = (
    "edgeserve.engine.jobs",
    "edgeserve.engine.policy",
    "edgeserve.engine.planning",
    "edgeserve.engine.draft_sizing",
    "edgeserve.engine.speculation",
    "edgeserve.engine.step_cost",
    "edgeserve.engine.slots",
    "edgeserve.engine.draft_model",
)
PURE = ("llama_cpp", "edgeserve.engine.llama")
UNREACHABLE = {
    "edgeserve/engine/policy.py": PURE,
    "edgeserve/engine/planning.py": PURE,
    "edgeserve/engine/draft_sizing.py": PURE,
    "edgeserve/engine/jobs.py": PURE,
    "edgeserve/engine/slots.py": PURE,
    "edgeserve/engine/speculation.py": PURE,
    "edgeserve/engine/step_cost.py": PURE,
    "edgeserve/engine/draft_model.py": PURE,
    "edgeserve/engine/ports.py": PURE,
    "tests/unit/fake_backend.py": PURE,
    **{
        str(path.relative_to(REPO)): POLICY_SIDE
        for path in sorted((PACKAGE / "engine" / "llama").glob("*.py"))
    },
    **{
        str(path.relative_to(REPO)): ("aiohttp", "edgeserve.http")
        for path in sorted((PACKAGE / "api").rglob("*.py"))
    },
}


def module_file(name: str) -> Path | None:
    """The file of an `edgeserve` or `tests` module (None for any other)."""
    if name.split(".")[0] not in ("edgeserve", "tests"):
        return None
    base = REPO.joinpath(*name.split("."))
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.is_file():
            return path
    return None


def is_type_checking(node: ast.AST) -> bool:
    return isinstance(node, ast.If) and ast.unparse(node.test) in (
        "TYPE_CHECKING",
        "typing.TYPE_CHECKING",
    )


def runtime_imports(path: Path) -> set[str]:
    """The modules `path` imports when it runs: `from a import b` names `a`, and `a.b` too
    when that is a module of ours."""
    names: set[str] = set()
    pending: list[ast.AST] = [ast.parse(path.read_text())]
    while pending:
        node = pending.pop()
        if is_type_checking(node):
            continue
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            module = from_module(node, path)
            names.update(from_names(node, path))
            names.update(
                f"{module}.{alias.name}"
                for alias in node.names
                if module_file(f"{module}.{alias.name}")
            )
        pending.extend(ast.iter_child_nodes(node))
    return names


def import_closure(path: Path) -> dict[str, str]:
    """Every module `path` reaches, each with the module it was first imported from; ours are
    followed through their files (a package's `__init__` runs with each of its modules)."""
    reached: dict[str, str] = {}
    queue: deque[tuple[Path, str]] = deque([(path, str(path.relative_to(REPO)))])
    seen_files = {path}
    while queue:
        file, via = queue.popleft()
        for name in sorted(runtime_imports(file)):
            parts = name.split(".")
            for end in range(1, len(parts) + 1):
                module = ".".join(parts[:end])
                if module in reached:
                    continue
                reached[module] = via
                found = module_file(module)
                if found is not None and found not in seen_files:
                    seen_files.add(found)
                    queue.append((found, module))
    return reached


def chain(reached: dict[str, str], module: str, start: str) -> str:
    """How `start` reaches `module`: the imports in order."""
    links = [module]
    while links[-1] != start:
        links.append(reached[links[-1]])
    return " <- ".join(links)


@pytest.mark.parametrize("part", sorted(UNREACHABLE))
def test_import_closure(part):
    path = REPO / part
    reached = import_closure(path)
    for module in reached:
        bad = [f for f in UNREACHABLE[part] if module == f or module.startswith(f + ".")]
        assert not bad, f"{part} reaches {module}: {chain(reached, module, part)}"


def test_the_closure_follows_imports_through_modules():
    reached = import_closure(PACKAGE / "engine" / "worker.py")
    assert "llama_cpp" in reached and "edgeserve.engine.llama.model" in reached
    assert chain(reached, "llama_cpp", "edgeserve/engine/worker.py").startswith("llama_cpp <- ")


@pytest.mark.parametrize(
    ("source", "where", "names"),
    [
        ("from ..http import app", "engine/policy.py", {"edgeserve.http"}),
        (
            "from . import jobs, slots",
            "engine/policy.py",
            {"edgeserve.engine.jobs", "edgeserve.engine.slots"},
        ),
        ("from .llama.model import X", "engine/worker.py", {"edgeserve.engine.llama.model"}),
        ("from .. import errors", "engine/llama/model.py", {"edgeserve.engine.errors"}),
        ("from .common import call", "api/__init__.py", {"edgeserve.api.common"}),
        ("from edgeserve.http import app", "engine/policy.py", {"edgeserve.http"}),
    ],
)
def test_relative_imports_name_the_module_they_reach(source, where, names):
    [node] = ast.parse(source).body
    assert isinstance(node, ast.ImportFrom)
    assert from_names(node, PACKAGE / where) == names
