"""Running the server: bind, load the model in the background, serve, drain on a signal.

Under systemd (`Type=notify`, see systemd/edgeserve.service) the process also reports its state
over `$NOTIFY_SOCKET`: READY=1 once the socket is bound and the model has loaded, WATCHDOG=1
from the event loop at half of `$WATCHDOG_USEC` (so a stuck loop gets the service restarted),
STOPPING=1 when the drain begins, and STATUS= lines along the way.

The engine thread is watched too: when one of its steps lasts `--engine-stall-s` (stuck inside
llama.cpp), the watchdog pings stop and the process drains and exits 1, as it does when the
engine thread dies, so that a supervisor restarts it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import ssl
import sys

from aiohttp import web

from edgeserve import sdnotify
from edgeserve.catalogue.entries import build_catalogue
from edgeserve.catalogue.fleet import Fleet
from edgeserve.config import Settings
from edgeserve.config.values import default_models_budget
from edgeserve.engine.client import EngineClient
from edgeserve.engine.worker import Engine
from edgeserve.http.app import create_app
from edgeserve.log import ROOT

log = logging.getLogger(ROOT)


def serve(settings: Settings, ssl_context: ssl.SSLContext | None = None) -> int:
    """Serve (HTTPS with `ssl_context`) until SIGTERM/SIGINT; return the process exit code
    (2 when the model fails)."""
    return asyncio.run(_serve(settings, ssl_context=ssl_context))


async def _watchdog(interval: float, engine: Engine | Fleet, stall_s: float) -> None:
    """Ping systemd's watchdog from the event loop while the engine thread makes progress: a
    blocked loop or a wedged engine misses its pings."""
    while True:
        if engine.stalled_for() < stall_s:
            sdnotify.notify(sdnotify.WATCHDOG)
        await asyncio.sleep(interval)


async def _engine_wedged(engine: Engine | Fleet, stall_s: float) -> None:
    """Return once one engine step has lasted `stall_s`."""
    while (stalled := engine.stalled_for()) < stall_s:
        await asyncio.sleep(max(0.05, min(1.0, stall_s - stalled)))


async def _serve(
    settings: Settings, engine: Engine | None = None, ssl_context: ssl.SSLContext | None = None
) -> int:
    """Run the server around `engine` (built from `settings` unless given), or around the
    catalogue's fleet; the exit code."""
    if settings.catalogue and engine is None:
        return await _serve_catalogue(settings, ssl_context)
    engine = engine or Engine(settings.engine_config())
    runner = await _listen(settings, create_app(settings, EngineClient(engine)), ssl_context)
    if runner is None:
        return 2
    interval = sdnotify.watchdog_interval()
    stall_s = settings.engine_stall_s
    watchdog = asyncio.create_task(_watchdog(interval, engine, stall_s)) if interval else None
    sdnotify.notify(sdnotify.status(f"loading {settings.model}"))
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    loop.add_signal_handler(
        signal.SIGHUP, log.info, "SIGHUP: nothing to re-read with --model alone (no catalogue)"
    )
    engine.start()
    loading = asyncio.ensure_future(asyncio.to_thread(engine.wait_loaded))
    stopping = asyncio.ensure_future(stop.wait())
    await asyncio.wait({loading, stopping}, return_when=asyncio.FIRST_COMPLETED)
    code = 0
    if loading.done() and not loading.result():
        print(f"edgeserve: error: cannot load the model: {engine.load_error}", file=sys.stderr)
        code = 2
    elif loading.done():
        code = await _serve_loaded(settings, engine, stopping)
    stopping.cancel()
    await _drain(settings, engine, runner)
    loading.cancel()
    if watchdog is not None:
        watchdog.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watchdog
    return code


async def _serve_catalogue(settings: Settings, ssl_context: ssl.SSLContext | None) -> int:
    """Serve the catalogue's models, each loaded on demand, until SIGTERM/SIGINT (0) or a
    wedged engine (1); SIGHUP re-reads the catalogue."""
    catalogue = build_catalogue(settings)
    budget = settings.models_memory or default_models_budget()
    fleet = Fleet(
        catalogue,
        memory_budget=budget,
        max_loaded=settings.models_max,
        keep_alive=settings.keep_alive,
        source=lambda: build_catalogue(settings),
        files_dir=settings.models_dir,
    )
    runner = await _listen(settings, create_app(settings, fleet), ssl_context)
    if runner is None:
        return 2
    log.info(
        "serving %d models (%s) within %.0f MiB, at most %d loaded",
        len(catalogue.entries),
        ", ".join(catalogue.ids()) or "none yet",
        budget / 2**20,
        settings.models_max,
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    loop.add_signal_handler(signal.SIGHUP, fleet.rescan)
    interval = sdnotify.watchdog_interval()
    stall_s = settings.engine_stall_s
    tasks = [asyncio.create_task(fleet.start()), asyncio.create_task(fleet.watch())]
    if interval:
        tasks.append(asyncio.create_task(_watchdog(interval, fleet, stall_s)))
    sdnotify.notify(
        sdnotify.READY, sdnotify.status(f"serving the catalogue on {settings.host}:{settings.port}")
    )
    stopping = asyncio.ensure_future(stop.wait())
    wedged = asyncio.ensure_future(_engine_wedged(fleet, stall_s))
    await asyncio.wait({stopping, wedged}, return_when=asyncio.FIRST_COMPLETED)
    code = 0
    if wedged.done():
        log.error(
            "an engine step has lasted %.0fs (an engine thread is stuck); exiting so a "
            "supervisor restarts us",
            stall_s,
        )
        code = 1
    for task in (stopping, wedged, *tasks):
        task.cancel()
    sdnotify.notify(
        sdnotify.STOPPING, sdnotify.status(f"draining (up to {settings.drain_timeout_s:g}s)")
    )
    log.info("shutting down: draining running requests (up to %.0fs)", settings.drain_timeout_s)
    await runner.cleanup()
    await fleet.close()
    return code


async def _listen(
    settings: Settings, app: web.Application, ssl_context: ssl.SSLContext | None
) -> web.AppRunner | None:
    """Bind `app` to the configured address; None (the error printed) when it cannot listen."""
    runner = web.AppRunner(
        app,
        handler_cancellation=True,
        shutdown_timeout=settings.drain_timeout_s,
        access_log=None,
    )
    await runner.setup()
    site = web.TCPSite(runner, settings.host, settings.port, ssl_context=ssl_context)
    try:
        await site.start()
    except OSError as exc:
        await runner.cleanup()
        print(
            f"edgeserve: error: cannot listen on {settings.host}:{settings.port}: {exc.strerror}",
            file=sys.stderr,
        )
        return None
    scheme = "https" if ssl_context else "http"
    log.info(
        "listening on %s://%s:%d (loading %s)", scheme, settings.host, settings.port, settings.model
    )
    return runner


async def _serve_loaded(settings: Settings, engine: Engine, stopping: asyncio.Future[bool]) -> int:
    """With the model loaded, report ready and serve until `stopping` (a signal: 0) or until the
    engine thread ends or wedges (1, so that a supervisor restarts the process)."""
    log.info("model loaded; ready")
    sdnotify.notify(
        sdnotify.READY,
        sdnotify.status(f"serving {settings.model_name} on {settings.host}:{settings.port}"),
    )
    engine_ended = asyncio.ensure_future(asyncio.to_thread(engine.wait_stopped))
    wedged = asyncio.ensure_future(_engine_wedged(engine, settings.engine_stall_s))
    await asyncio.wait({stopping, engine_ended, wedged}, return_when=asyncio.FIRST_COMPLETED)
    wedged.cancel()
    if stopping.done():
        return 0
    if engine_ended.done():
        log.error("the engine thread stopped unexpectedly; exiting so a supervisor restarts us")
    else:
        log.error(
            "an engine step has lasted %.0fs (the engine thread is stuck); exiting so a "
            "supervisor restarts us",
            settings.engine_stall_s,
        )
    return 1


async def _drain(settings: Settings, engine: Engine, runner: web.AppRunner) -> None:
    """Stop taking requests, give the running ones up to `--drain-timeout-s`, close the engine."""
    sdnotify.notify(
        sdnotify.STOPPING, sdnotify.status(f"draining (up to {settings.drain_timeout_s:g}s)")
    )
    log.info("shutting down: draining running requests (up to %.0fs)", settings.drain_timeout_s)
    engine.stop_accepting()
    await runner.cleanup()
    await asyncio.to_thread(engine.close)
