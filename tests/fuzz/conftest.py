"""Fuzz fixtures: one real server process for the HTTP fuzzing, with the tiny projector's
vision and audio encoders (so images and audio reach their decoders and the projector),
runtime LoRA on (so its endpoints parse bodies), and a small context and token cap (so that
every answer takes a moment)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.fuzz.server import FuzzServer


@pytest.fixture(scope="session")
def fuzz_server(model_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[FuzzServer]:
    from tests.fixtures.tiny_projector import write_tiny_projector

    folder = tmp_path_factory.mktemp("fuzz-server")
    projector = folder / "tiny-mmproj.gguf"
    write_tiny_projector(projector, seed=0, audio=True)
    server = FuzzServer(
        model_path,
        folder / "server.log",
        "--mmproj",
        str(projector),
        "--allow-runtime-lora",
        "--threads",
        "2",
        "--ctx-size",
        "512",
        "--parallel",
        "2",
        "--max-n",
        "2",
        "--max-tokens-cap",
        "16",
    )
    try:
        server.wait_ready()
        yield server
    finally:
        code = server.stop()
    assert code == 0, f"the server did not stop cleanly ({code}):\n{server.log_tail()}"
