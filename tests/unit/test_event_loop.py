"""`--event-loop`: which loop the server runs on, and a clear refusal of a uvloop that is not
installed."""

from __future__ import annotations

import asyncio
import importlib.util

import pytest

from edgeserve.config import ConfigError, load_settings, values
from edgeserve.http.event_loop import loop_factory, loop_name


def run_on(choice: str) -> str:
    """The name of the loop a coroutine runs on under `choice`."""

    async def name() -> str:
        return loop_name(asyncio.get_running_loop())

    with asyncio.Runner(loop_factory=loop_factory(choice)) as runner:
        return runner.run(name())


def test_auto_and_uvloop_run_on_uvloop_where_it_is_installed():
    assert importlib.util.find_spec("uvloop") is not None, "uvloop is a dependency on POSIX"
    assert run_on("auto") == "uvloop"
    assert run_on("uvloop") == "uvloop"


def test_asyncio_runs_on_asyncios_own_loop():
    assert loop_factory("asyncio") is None
    assert run_on("asyncio") == "asyncio"


def test_uvloop_without_uvloop_installed_is_a_settings_error(monkeypatch, tmp_path):
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "uvloop" else real(name, *a)
    )
    with pytest.raises(ConfigError, match="uvloop, which is not installed"):
        load_settings(["--model", str(model), "--event-loop", "uvloop"], {})
    assert values.event_loop("AUTO") == "auto"
    with pytest.raises(ValueError, match="is not one of auto, uvloop, asyncio"):
        values.event_loop("trio")
