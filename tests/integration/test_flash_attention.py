"""Flash attention as --flash-attn resolves it on this build: `auto` (the default) turns it on
for the default model on the CPU, /health and the load log say so, `off` keeps it off, and a
quantized V cache llama.cpp refuses without it fails the load with one line."""

from __future__ import annotations

import logging

import pytest

from edgeserve.engine.client import EngineClient
from edgeserve.engine.llama.model import ModelLoadError
from edgeserve.engine.types import EngineConfig
from edgeserve.engine.worker import Engine
from edgeserve.http.app import create_app
from tests.conftest import running_engine
from tests.integration.conftest import server_settings


async def test_the_default_engine_runs_flash_attention_and_health_says_so(client, engine):
    assert engine.config.flash_attn == "auto"
    body = await (await client.get("/health")).json()
    assert body["flash_attn"] is True
    assert engine.stats().flash_attn is True


async def test_off_keeps_it_off_and_health_and_the_load_log_say_so(
    aiohttp_client, model_path, caplog
):
    off = running_engine(model_path, n_ctx=256, parallel=1, flash_attn="off")
    with caplog.at_level(logging.INFO, logger="edgeserve.engine"), off as engine:
        client = await aiohttp_client(create_app(server_settings(model_path), EngineClient(engine)))
        body = await (await client.get("/health")).json()
        assert body["flash_attn"] is False
        assert engine.stats().flash_attn is False
    loaded = [r.getMessage() for r in caplog.records if r.getMessage().startswith("loaded ")]
    assert loaded and loaded[-1].endswith(", flash attention off"), loaded


@pytest.mark.parametrize("kv_cache_type", ["q8_0", "q4_0"])
def test_a_quantized_v_cache_without_flash_attention_fails_in_one_line(model_path, kv_cache_type):
    # The settings refuse this pair; llama.cpp refuses it the same way where `auto` resolves
    # to off (e.g. an architecture it forces off), which an engine made directly shows.
    config = EngineConfig(
        model_path=str(model_path),
        n_ctx=256,
        parallel=1,
        flash_attn="off",
        kv_cache_type=kv_cache_type,
    )
    engine = Engine(config)
    assert not engine.load()
    error = engine.load_error
    assert isinstance(error, ModelLoadError)
    message = str(error)
    assert "\n" not in message
    assert message.startswith(f"--kv-cache-type {kv_cache_type} needs flash attention")
    assert "use --kv-cache-type f16, or a backend with flash attention" in message
