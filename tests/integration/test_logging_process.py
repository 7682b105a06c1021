"""Logs of the real `edgeserve serve` process: JSON lines for journald; prompts only on request."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest

from tests.integration.conftest import EOS_BAN
from tests.integration.test_server_process import free_port

SECRET = "zebra-violet-4417"
BODY = {
    "model": "m",
    "messages": [{"role": "user", "content": f"My password is {SECRET}."}],
    "max_tokens": 5,
    "logit_bias": EOS_BAN,
}


async def run_requests(server) -> None:
    async with aiohttp.ClientSession() as session:
        await server.wait_ready(session)
        url = f"{server.url}/v1/chat/completions"
        async with session.post(url, json=BODY, headers={"X-Request-Id": "trace-1"}) as resp:
            assert resp.status == 200
            assert resp.headers["X-Request-Id"] == "trace-1"
        stream = {**BODY, "stream": True}
        async with session.post(url, json=stream, headers={"X-Request-Id": "trace-2"}) as resp:
            assert resp.status == 200
            await resp.read()


class LoggingServer:
    """`edgeserve serve` on a free port with its stderr in a file (debug logs can exceed a pipe's
    buffer, and a full pipe would block the server's event loop)."""

    def __init__(self, model: Path, log: Path, *args: str) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = log
        env = {k: v for k, v in os.environ.items() if not k.startswith(("EDGESERVE_", "API_"))}
        with log.open("w") as sink:
            self.proc = subprocess.Popen(
                [
                    *(sys.executable, "-m", "edgeserve", "serve", "--model", str(model)),
                    *("--port", str(self.port), "--threads", "1", "--ctx-size", "1024", *args),
                ],
                stdout=subprocess.DEVNULL,
                stderr=sink,
                env=env,
            )

    async def wait_ready(self, session: aiohttp.ClientSession) -> None:
        for _ in range(1200):
            assert self.proc.poll() is None, self.log.read_text()
            try:
                async with session.get(f"{self.url}/health") as resp:
                    if resp.status == 200:
                        return
            except aiohttp.ClientConnectionError:
                pass
            await asyncio.sleep(0.05)
        raise TimeoutError("server did not become ready")

    def stop(self) -> tuple[int, str]:
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(timeout=60)
        return self.proc.returncode, self.log.read_text()


@pytest.fixture
def start(model_path, tmp_path) -> Iterator[object]:
    """Start servers with extra flags; any still running at the end are killed."""
    started: list[LoggingServer] = []

    def run(*args: str) -> LoggingServer:
        started.append(LoggingServer(model_path, tmp_path / f"stderr-{len(started)}.log", *args))
        return started[-1]

    yield run
    for server in started:
        if server.proc.poll() is None:
            server.proc.kill()
            server.proc.wait()


def json_lines(stderr: str) -> list[dict]:
    """Every stderr line is one JSON object."""
    lines = stderr.splitlines()
    assert lines
    return [json.loads(line) for line in lines]


async def test_json_logs_end_to_end_without_prompts(start):
    server = start("--log-format", "json", "--log-level", "debug")
    await run_requests(server)
    code, err = server.stop()
    assert code == 0, err
    entries = json_lines(err)
    assert SECRET not in err, "prompt text was logged without --log-prompts"
    for entry in entries:
        assert {"ts", "level", "logger", "msg"} <= entry.keys()
    access = {e["request_id"]: e for e in entries if e["logger"] == "edgeserve.access"}
    for rid in ("trace-1", "trace-2"):
        line = access[rid]
        assert line["level"] == "info"
        assert line["msg"] == "POST /v1/chat/completions 200"
        assert line["status"] == 200
        assert line["prompt_tokens"] > 0
        assert line["completion_tokens"] == 5
        assert line["ttft_ms"] > 0
        assert line["tokens_per_s"] > 0
    assert any(e["logger"] == "edgeserve" and "ready" in e["msg"] for e in entries)


async def test_log_prompts_shows_the_prompt_at_debug_level(start):
    server = start("--log-format", "json", "--log-prompts")
    await run_requests(server)
    code, err = server.stop()
    assert code == 0, err
    entries = json_lines(err)
    prompts = [e for e in entries if e["logger"] == "edgeserve.prompts"]
    assert [e["request_id"] for e in prompts] == ["trace-1", "trace-2"]
    for entry in prompts:
        assert entry["level"] == "debug"
        assert json.loads(entry["prompt"]) == [BODY["messages"][0]]
    # --log-level stays info for everything else.
    assert all(e["level"] != "debug" for e in entries if e["logger"] != "edgeserve.prompts")


async def test_log_prompts_shows_a_responses_prompt(start):
    server = start("--log-format", "json", "--log-prompts")
    body = {"model": "m", "instructions": "Be brief.", "input": SECRET, "max_output_tokens": 2}
    async with aiohttp.ClientSession() as session:
        await server.wait_ready(session)
        url = f"{server.url}/v1/responses"
        async with session.post(url, json=body, headers={"X-Request-Id": "trace-r"}) as resp:
            assert resp.status == 200
    code, err = server.stop()
    assert code == 0, err
    [entry] = [e for e in json_lines(err) if e["logger"] == "edgeserve.prompts"]
    assert entry["request_id"] == "trace-r"
    assert json.loads(entry["prompt"]) == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": SECRET},
    ]
