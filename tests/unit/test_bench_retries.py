"""A bench run disturbed by other processes is done again with prompts of its own: a retry that
re-sent the first try's prompts hit every server's prompt cache (one llama-server retry measured
TTFT 759 ms against 9672 ms). Driven against a small recording chat server (aiohttp), with the
CPU meter scripted to call the first try noisy. At one stream the servers take turns request by
request, so that the machine's slow and fast spells fall on each alike."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any, ClassVar

import pytest
from aiohttp import web

import bench.__main__ as bench_main
from bench import load, lora
from bench.__main__ import Bench, parse_args
from tests.unit.bench_models import vocab_gguf
from tests.unit.fake_chat_server import streaming_chat_app

LEVELS = (1, 2, 4, 8)


def test_every_load_request_round_level_and_attempt_has_its_own_prompt():
    load_indices = [
        load.load_prompt_index(rnd, c, r, w, sampled, attempt)
        for attempt in range(3)
        for rnd in range(5)
        for c in LEVELS
        for r in range(16)
        for w in range(c)
        for sampled in (False, True)
    ]
    assert len(set(load_indices)) == len(load_indices)
    lora_indices = [
        lora.prompt_index(rnd, mode, r, w, attempt)
        for attempt in range(3)
        for rnd in range(5)
        for mode in lora.MODES
        for r in range(4)
        for w in range(lora.PARALLEL)
    ]
    assert len(set(lora_indices)) == len(lora_indices)
    assert not set(load_indices) & set(lora_indices)


class ScriptedNoiseMeter:
    """Stands in for CpuMeter: other processes used `noise[i]` CPU seconds during try i."""

    noise: ClassVar[list[float]] = []
    made: ClassVar[int] = 0

    def __init__(self, running: list[Any]) -> None:
        self.index = ScriptedNoiseMeter.made
        ScriptedNoiseMeter.made += 1

    def other(self) -> float:
        return self.noise[self.index]


class RecordingServer:
    """The bench's view of a server (url, kind, cpu) in front of the recording app."""

    def __init__(self, url: str, kind: str = "edgeserve") -> None:
        self.url = url
        self.kind = kind

    def cpu(self) -> float:
        return 0.0


@pytest.fixture
def bench(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Bench:
    model = vocab_gguf(tmp_path / "m.gguf")
    args = parse_args(["--model", str(model), "--out", str(tmp_path), "--noisy-retries", "2"])
    args.requests, args.tokens = 2, 2

    async def quiet_already(self: Bench, running: list[Any]) -> None:
        return None

    monkeypatch.setattr(Bench, "wait_quiet", quiet_already)
    monkeypatch.setattr(bench_main, "CpuMeter", ScriptedNoiseMeter)
    ScriptedNoiseMeter.made = 0
    return Bench(args)


async def recording_app(
    aiohttp_server: Any, prompts: list[str], turns: list[str] | None = None, name: str = ""
) -> Any:
    async def chat(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        prompts.append(body["messages"][0]["content"])
        if turns is not None:
            turns.append(name)
        await asyncio.sleep(0.01)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for piece in ("a", "b"):
            chunk = {"choices": [{"index": 0, "delta": {"content": piece}}]}
            await resp.write(f"data: {json.dumps(chunk)}\n\n".encode())
        usage = {"choices": [], "usage": {"completion_tokens": 2, "prompt_tokens": 9}}
        await resp.write(f"data: {json.dumps(usage)}\n\ndata: [DONE]\n\n".encode())
        return resp

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    return await aiohttp_server(app)


async def test_a_noisy_load_run_is_retried_with_new_prompts(bench: Bench, aiohttp_server: Any):
    prompts: list[str] = []
    server = await recording_app(aiohttp_server, prompts)
    ScriptedNoiseMeter.noise = [100.0, 0.0]
    url = str(server.make_url("")).rstrip("/")
    await bench.measured([], bench.speed_models[0], RecordingServer(url), 4, 0)
    assert len(prompts) == 2 * 4 * 2  # two tries of 4 workers x 2 requests
    first, second = prompts[:8], prompts[8:]
    assert not set(first) & set(second)
    assert bench.results["runs"][0]["other_cpu_s"] == 0.0  # the quiet try's figures are kept


async def test_a_quiet_run_is_not_retried(bench: Bench, aiohttp_server: Any):
    prompts: list[str] = []
    server = await recording_app(aiohttp_server, prompts)
    ScriptedNoiseMeter.noise = [0.0]
    url = str(server.make_url("")).rstrip("/")
    await bench.measured([], bench.speed_models[0], RecordingServer(url), 4, 0)
    assert len(prompts) == 8 and len(set(prompts)) == 8


async def test_a_round_at_low_concurrency_still_runs_eight_streams(
    bench: Bench, aiohttp_server: Any
):
    prompts: list[str] = []
    server = await recording_app(aiohttp_server, prompts)
    ScriptedNoiseMeter.noise = [0.0]
    url = str(server.make_url("")).rstrip("/")
    await bench.measured([], bench.speed_models[0], RecordingServer(url), 1, 0)
    assert len(prompts) == 8 and len(set(prompts)) == 8  # one worker, 8 requests, not 2


async def test_at_one_stream_the_servers_take_turns_request_by_request(
    bench: Bench, aiohttp_server: Any
):
    turns: list[str] = []
    prompts: dict[str, list[str]] = {"edgeserve": [], "llama-server": []}
    servers = []
    for kind in prompts:
        app = await recording_app(aiohttp_server, prompts[kind], turns, kind)
        servers.append(RecordingServer(str(app.make_url("")).rstrip("/"), kind))
    ScriptedNoiseMeter.noise = [0.0, 0.0]
    model = bench.speed_models[0]
    await bench.in_turns([], model, servers, 0)
    requests = 2 * bench_main.per_stream(bench.args.requests, 1)  # greedy, then sampled
    assert len(turns) == 2 * requests
    assert all({turns[i], turns[i + 1]} == set(prompts) for i in range(0, len(turns), 2))
    assert turns[0] != turns[2], "the first server rotates"
    assert prompts["edgeserve"] == prompts["llama-server"]  # the same prompt, in turn
    assert len(set(prompts["edgeserve"])) == requests
    runs = model.out["runs"]
    assert [(r["server"], r["temperature"]) for r in runs] == [
        ("edgeserve", 0.0),
        ("llama-server", 0.0),
        ("edgeserve", bench.args.sampled_temperature),
        ("llama-server", bench.args.sampled_temperature),
    ]
    assert all(r["requests"] == requests // 2 and r["round"] == 0 for r in runs)


async def test_a_noisy_lora_run_is_retried_with_new_prompts(
    bench: Bench, monkeypatch: pytest.MonkeyPatch
):
    tries: list[int] = []

    async def recorded_run(*args: Any, attempt: int) -> dict[str, Any]:
        tries.append(attempt)
        return {"per_set": {}, "aggregate_tps": 1.0, "itl_p50_ms": 1.0, "itl_p99_ms": 1.0,
                "short": 0, "errors": []}  # fmt: skip

    monkeypatch.setattr(lora, "run", recorded_run)
    ScriptedNoiseMeter.noise = [100.0, 100.0, 0.0]
    server = RecordingServer("http://127.0.0.1:1")
    noise, _ = await bench.quietest([], bench.lora_run(server, lora.MIXED, 0))
    assert tries == [0, 1, 2]
    assert noise == 0.0


class StartedServer(RecordingServer):
    """A RecordingServer as `Bench.start_level` returns it, with the memory a level reads."""

    loaded_rss = 100

    def rss(self) -> dict[str, int]:
        return {"VmHWM": 120, "VmRSS": 110, "RssAnon": 60, "RssFile": 50}

    def rss_now(self) -> int:
        return 110


class StoppingServers:
    """Stands in for bench.anchors.Servers: records which servers the level stops."""

    def __init__(self) -> None:
        self.stopped: list[StartedServer] = []

    def stop(self, server: StartedServer) -> None:
        self.stopped.append(server)


async def test_every_round_of_a_level_runs_on_servers_started_anew(
    bench: Bench, aiohttp_server: Any, monkeypatch: pytest.MonkeyPatch
):
    rounds, kinds = 3, ("edgeserve", "llama-server")
    bench.args.rounds, bench.kinds = rounds, list(kinds)
    served: dict[str, list[str]] = {}  # a started process's name: the prompts it answered
    started: list[list[StartedServer]] = []

    async def start_level(
        self: Bench, servers: Any, model: Any, c: int, rnd: int
    ) -> list[StartedServer]:
        assert rnd == len(started) and c == 2
        procs = []
        for kind in kinds:
            name = f"{kind}#{rnd}"
            served[name] = []
            app = await recording_app(aiohttp_server, served[name])
            procs.append(StartedServer(str(app.make_url("")).rstrip("/"), kind))
        started.append(procs)
        return procs

    async def no_idle_cpu(running: list[Any], seconds: float = 1.0) -> list[float]:
        return [0.0] * len(running)

    monkeypatch.setattr(Bench, "start_level", start_level)
    monkeypatch.setattr(bench_main, "idle_cpu_pct", no_idle_cpu)
    ScriptedNoiseMeter.noise = [0.0] * 4 * rounds
    servers = StoppingServers()
    await bench.level(servers, bench.speed_models[0], 0, 2)  # type: ignore[arg-type]
    assert len(started) == rounds
    every = [server for procs in started for server in procs]
    assert servers.stopped == every, "each round's processes stop, the last ones at the end"
    per_run = 2 * bench_main.per_stream(bench.args.requests, 2)  # 2 streams' requests
    answered = {name: len(prompts) for name, prompts in served.items()}
    assert answered == dict.fromkeys(served, 2 * per_run)  # greedy, then sampled
    runs = bench.speed_models[0].out["runs"]
    assert sorted((r["server"], r["round"]) for r in runs) == sorted(
        (kind, rnd) for rnd in range(rounds) for kind in kinds for _ in range(2)
    )


async def test_the_edgeserves_soak_side_by_side(bench: Bench, monkeypatch: pytest.MonkeyPatch):
    """One after the other, the second soak would start after idling through the first, its
    heap trimmed, and end lower for that alone: each soak here waits for the other to begin."""
    begun: list[str] = []
    both = asyncio.Event()

    async def soaking(url: str, n: int, c: int, rss: Any, eog: Any) -> dict[str, Any]:
        begun.append(url)
        if len(begun) == 2:
            both.set()
        await asyncio.wait_for(both.wait(), 2.0)
        return {"requests": n, "url": url}

    monkeypatch.setattr(bench_main.soak, "soak", soaking)
    bench.args.soak_requests = 10
    kinds = ("edgeserve", "edgeserve-baseline", "llama-server")
    running = [StartedServer(f"http://{kind}", kind) for kind in kinds]
    await bench.soak(running, 4)  # type: ignore[arg-type]
    assert sorted(begun) == ["http://edgeserve", "http://edgeserve-baseline"]
    assert bench.results["soak"]["edgeserve-baseline"] == {
        "requests": 10,
        "url": "http://edgeserve-baseline",
        "concurrency": 4,
    }


async def test_a_run_puts_edgeserve_s_engine_time_a_step_from_its_metrics_on_its_result(
    aiohttp_server: Any,
):
    """Each answered request adds 3 steps, 30 ms of decode, 1.5 ms of sampling and 0.6 ms of
    waiting for the loop to the /metrics of the server it went to; llama-server's result gets
    no figure."""
    servers = []
    for kind in ("edgeserve", "llama-server"):
        steps = [30]  # before the run

        def answered(body: dict[str, Any], steps: list[int] = steps) -> None:
            steps[0] += 3

        async def metrics(request: web.Request, steps: list[int] = steps) -> web.Response:
            n = steps[0]
            return web.Response(
                text=f"edgeserve_engine_steps_total {n}.0\n"
                f'edgeserve_engine_phase_seconds_total{{phase="decode"}} {0.01 * n}\n'
                f'edgeserve_engine_phase_seconds_total{{phase="sample"}} {0.0005 * n}\n'
                f'edgeserve_engine_phase_seconds_total{{phase="loops"}} {0.0002 * n}\n'
            )

        app = streaming_chat_app(answered)
        app.router.add_get("/metrics", metrics)
        server = await aiohttp_server(app)
        servers.append(RecordingServer(str(server.make_url("")).rstrip("/"), kind))
    runs = {r.server: r for r in await load.run_in_turns(servers, 2, load.LoadShape(2, 4, (0,)))}
    assert runs["edgeserve"].engine_step_ms == pytest.approx(0.5)
    assert runs["edgeserve"].engine_phases_ms == pytest.approx(
        {"decode": 10.0, "sample": 0.5, "loops": 0.2, "outside_decode": 0.5}
    )
    assert runs["edgeserve"].loop_wait_ms == pytest.approx(0.2)
    assert runs["llama-server"].engine_step_ms is None
