"""The servers under test: edgeserve and its anchors, started and stopped as child processes.

- `edgeserve`: `.venv/bin/edgeserve serve …` (this checkout);
- `edgeserve-baseline`: the previous edgeserve (`--baseline`, built by `bench.baseline`), started
  exactly like `edgeserve`, so that a figure that gets worse shows beside the anchors;
- `llama-server`: llama.cpp's own server (built by `bench.build`), continuous batching with
  `--parallel N` slots over one unified KV cache of `--ctx-size` cells, its other settings its
  defaults (flash attention `auto`);
- `llama_cpp.server`: llama-cpp-python's server (`python -m llama_cpp.server`) from the bench's
  own venv, which holds the same llama-cpp-python wheel edgeserve uses.

Every server listens on 127.0.0.1 only, runs in its own process group with its log in
`bench/results/logs/`, and is stopped (SIGTERM, then SIGKILL) when the `Servers` stack closes,
also on errors and Ctrl-C.
"""

from __future__ import annotations

import asyncio
import ctypes
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Collection, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

import aiohttp

EDGESERVE = "edgeserve"
EDGESERVE_BASELINE = "edgeserve-baseline"
LLAMA_SERVER = "llama-server"
LCP_SERVER = "llama_cpp.server"
ALL_SERVERS = (EDGESERVE, EDGESERVE_BASELINE, LLAMA_SERVER, LCP_SERVER)
# The edgeserves: every workload that edgeserve runs, its baseline runs too.
EDGESERVES = (EDGESERVE, EDGESERVE_BASELINE)
HOST = "127.0.0.1"
PAGE = os.sysconf("SC_PAGE_SIZE")
TICKS = os.sysconf("SC_CLK_TCK")
PR_SET_PDEATHSIG = 1


@dataclass(frozen=True)
class Setup:
    """What every server gets: the same model, threads and context, plus where things are."""

    model: Path
    threads: int
    ctx_size: int
    edgeserve: Path
    llamacpp_bin: Path
    lcp_python: Path
    logs: Path
    baseline: Path | None = None
    # The built-in chat template the anchors use for a GGUF without one (Gemma 3's: "gemma");
    # None: the GGUF's own, as edgeserve uses it.
    chat_format: str | None = None
    # A folder of models served instead of `model`: edgeserve's catalogue (--models-dir) and
    # llama-server's router (a child process per model); None: `model` alone.
    models_dir: Path | None = None


def command(
    kind: str, setup: Setup, port: int, parallel: int, extra: tuple[str, ...] = ()
) -> list[str]:
    """The command line that serves `setup.model` on `port` with `parallel` sequences, plus
    `extra` arguments."""
    return [*_base_command(kind, setup, port, parallel), *extra]


def _base_command(kind: str, setup: Setup, port: int, parallel: int) -> list[str]:
    model, threads, ctx = str(setup.model), str(setup.threads), str(setup.ctx_size)
    if kind in EDGESERVES:
        binary = setup.edgeserve if kind == EDGESERVE else setup.baseline
        if binary is None:
            raise ValueError(f"{kind} needs --baseline")
        return [str(binary), "serve", *_served(kind, setup), "--host", HOST,
                "--port", str(port), "--threads", threads, "--parallel", str(parallel),
                "--ctx-size", ctx, "--log-level", "warning"]  # fmt: skip
    if kind == LLAMA_SERVER:
        return [str(setup.llamacpp_bin / "llama-server"), *_served(kind, setup), "--host", HOST,
                "--port", str(port), "-t", threads, "-c", ctx, "--parallel", str(parallel),
                "--kv-unified", "--cont-batching", "--no-webui",
                *(("--no-jinja", "--chat-template", setup.chat_format)
                  if setup.chat_format else ())]  # fmt: skip
    if kind == LCP_SERVER:
        if setup.models_dir is not None:
            raise ValueError(f"{kind} serves one model")
        return [str(setup.lcp_python), "-m", "llama_cpp.server", "--model", model,
                "--host", HOST, "--port", str(port),
                *(("--chat_format", setup.chat_format) if setup.chat_format else ()),
                "--n_threads", threads, "--n_threads_batch", threads, "--n_ctx", ctx,
                "--verbose", "False"]  # fmt: skip
    raise ValueError(f"unknown server {kind!r}")


def _served(kind: str, setup: Setup) -> tuple[str, ...]:
    """The arguments that name what an edgeserve or llama-server serves: the model, or the
    folder of models (`setup.models_dir`)."""
    if setup.models_dir is not None:
        return ("--models-dir", str(setup.models_dir))
    return ("--model" if kind in EDGESERVES else "-m", str(setup.model))


def ctx_args(kind: str, n_ctx: int) -> tuple[str, ...]:
    """Arguments that give an edgeserve or llama-server a context of `n_ctx` cells instead of
    the setup's (the last one given counts, in both parsers)."""
    flag = "-c" if kind == LLAMA_SERVER else "--ctx-size"
    return (flag, str(n_ctx))


def server_env() -> dict[str, str]:
    """The environment a server (or its `--help`) runs in: this process's without PYTHONPATH,
    so that each edgeserve imports its own install's code (the baseline's, the venv's), never
    the checkout the bench was started from."""
    return {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}


def health_path(kind: str) -> str:
    """A GET path that answers 200 once the model is loaded."""
    return "/v1/models" if kind == LCP_SERVER else "/health"


def _die_with_parent() -> None:
    """In the child, before exec: get SIGTERM if the bench dies, even by SIGKILL (Linux)."""
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def free_port(taken: Collection[int] = ()) -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now and that is not in `taken`
    (ports handed to servers that may still be loading: llama-server binds only after its
    model is loaded, and the kernel may offer the same free port twice)."""
    while True:
        with socket.socket() as sock:
            sock.bind((HOST, 0))
            port = int(sock.getsockname()[1])
        if port not in taken:
            return port


def proc_status(pid: int) -> dict[str, int]:
    """VmRSS, VmHWM, RssAnon and RssFile (bytes) of a live process; {} when it is gone."""
    out: dict[str, int] = {}
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                key, _, rest = line.partition(":")
                if key in ("VmRSS", "VmHWM", "RssAnon", "RssFile"):
                    out[key] = int(rest.split()[0]) * 1024
    except OSError:
        return {}
    return out


def _stat_fields(pid: int) -> list[str]:
    """The fields of /proc/PID/stat after the command's name (state first); [] when gone."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return []


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process, its waited-for children's included (0.0 when it
    is gone)."""
    fields = _stat_fields(pid)
    if not fields:
        return 0.0
    return sum(int(v) for v in fields[11:15]) / TICKS


def descendants(parents: Mapping[int, int], root: int) -> list[int]:
    """The processes below `root` (children, their children, ...), from each process's
    parent (`parents`: pid -> parent pid), parents before their children."""
    children: dict[int, list[int]] = {}
    for pid, parent in sorted(parents.items()):
        children.setdefault(parent, []).append(pid)
    found: list[int] = []
    todo = [root]
    while todo:
        below = children.get(todo.pop(0), [])
        found += below
        todo += below
    return found


def process_tree(root: int) -> list[int]:
    """`root` and every live process below it (llama-server's router and its children)."""
    parents = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            fields = _stat_fields(int(entry.name))
            if fields:
                parents[int(entry.name)] = int(fields[1])
    return [root, *descendants(parents, root)]


def machine_busy_seconds() -> float:
    """CPU seconds all processes have spent since boot (every core, idle and iowait excluded)."""
    with open("/proc/stat") as fh:
        values = [int(v) for v in fh.readline().split()[1:]]
    return (sum(values[:8]) - values[3] - values[4]) / TICKS


@dataclass
class Server:
    """One running server process."""

    kind: str
    parallel: int
    port: int
    proc: subprocess.Popen[bytes]
    log: Path
    loaded_rss: int = 0
    notes: dict[str, float] = field(default_factory=dict)

    @property
    def url(self) -> str:
        """Base URL (loopback only)."""
        return f"http://{HOST}:{self.port}"

    def rss(self) -> dict[str, int]:
        """Current (VmRSS) and peak (VmHWM) resident memory in bytes."""
        return proc_status(self.proc.pid)

    def rss_now(self) -> int:
        """Current resident memory (VmRSS) in bytes, 0 when the process is gone."""
        return self.rss().get("VmRSS", 0)

    def cpu(self) -> float:
        """CPU seconds used so far, by the server's process and those below it."""
        return sum(cpu_seconds(pid) for pid in process_tree(self.proc.pid))

    def tree_rss(self) -> tuple[int, int]:
        """Resident memory (VmRSS, bytes) of the server's process and those below it (a
        router's per-model processes) together, and how many processes that is."""
        pids = process_tree(self.proc.pid)
        return sum(proc_status(pid).get("VmRSS", 0) for pid in pids), len(pids)

    def log_tail(self, lines: int = 15) -> str:
        """The end of the server's log, for error messages."""
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def stop(self) -> None:
        """SIGTERM the process group, then SIGKILL after 15 s."""
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
            except ProcessLookupError:
                pass


class Servers(AbstractContextManager["Servers"]):
    """Starts servers and guarantees that every one of them is stopped on exit."""

    def __init__(self, setup: Setup) -> None:
        self.setup = setup
        self.running: list[Server] = []

    def start(self, kind: str, parallel: int, extra: tuple[str, ...] = (), tag: str = "") -> Server:
        """Spawn a server, with `extra` arguments (returns at once; see `wait_ready`); `tag`
        goes into its log's name (the arguments do too)."""
        port = free_port({s.port for s in self.running if s.proc.poll() is None})
        self.setup.logs.mkdir(parents=True, exist_ok=True)
        names = (Path(arg).name.strip("-") for arg in (*extra, tag) if arg)  # a path: its name
        suffix = "-".join(names)
        log = self.setup.logs / f"{kind}-p{parallel}{'-' + suffix if suffix else ''}.log"
        with open(log, "wb") as out:
            proc = subprocess.Popen(
                command(kind, self.setup, port, parallel, extra),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=server_env(),
                start_new_session=True,
                preexec_fn=_die_with_parent,
            )
        server = Server(kind, parallel, port, proc, log)
        self.running.append(server)
        return server

    async def wait_ready(self, server: Server, timeout: float = 180.0) -> None:
        """Poll the health path until it answers 200; fail with the log if the process dies."""
        deadline = time.monotonic() + timeout
        async with aiohttp.ClientSession() as session:
            while time.monotonic() < deadline:
                if server.proc.poll() is not None:
                    raise RuntimeError(
                        f"{server.kind} exited with {server.proc.returncode}:\n{server.log_tail()}"
                    )
                try:
                    url = server.url + health_path(server.kind)
                    async with session.get(url, timeout=aiohttp.ClientTimeout(total=2)) as resp:
                        if resp.status == 200:
                            return
                except (aiohttp.ClientError, TimeoutError):
                    pass
                await asyncio.sleep(0.1)
        raise RuntimeError(f"{server.kind} not ready after {timeout:.0f} s:\n{server.log_tail()}")

    def stop(self, server: Server) -> None:
        """Stop one server now."""
        server.stop()
        if server in self.running:
            self.running.remove(server)

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        for server in list(self.running):
            self.stop(server)


def llama_bench_tg(setup: Setup, tokens: int, depth: int, reps: int) -> dict[str, float]:
    """llama-bench's tg figure (tokens/s, no sampling, no HTTP) at `depth` tokens of context,
    with llama.cpp's defaults (flash attention `auto`, as llama-server's)."""
    cmd = [str(setup.llamacpp_bin / "llama-bench"), "-m", str(setup.model),
           "-t", str(setup.threads), "-p", "0", "-n", str(tokens), "-d", str(depth),
           "-r", str(reps), "-o", "json"]  # fmt: skip
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, start_new_session=True
    )
    try:
        out, _ = proc.communicate(timeout=600)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    if proc.returncode != 0:
        raise RuntimeError(f"llama-bench failed ({proc.returncode}): {' '.join(cmd)}")
    row = json.loads(out)[0]
    return {"tokens": tokens, "depth": depth, "reps": reps,
            "tps": float(row["avg_ts"]), "stddev": float(row["stddev_ts"])}  # fmt: skip


def physical_cores() -> int:
    """Distinct (package, core) pairs in /proc/cpuinfo; the CPU count when that is unknown."""
    cores: set[tuple[str, str]] = set()
    package = core = ""
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                key, _, value = (s.strip() for s in line.partition(":"))
                if key == "physical id":
                    package = value
                elif key == "core id":
                    core = value
                    cores.add((package, core))
    except OSError:
        pass
    return len(cores) or os.cpu_count() or 1


def default_lcp_python() -> Path:
    """The interpreter for llama_cpp.server: the bench venv's (this one when running in it)."""
    return Path(sys.executable)
