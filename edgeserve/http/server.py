"""Running the server: bind, load the model in the background, serve, drain on a signal."""

from __future__ import annotations

import asyncio
import logging
import signal
import sys

from aiohttp import web

from edgeserve.config import Settings
from edgeserve.engine.client import EngineClient
from edgeserve.engine.scheduler import Engine
from edgeserve.http.app import create_app

log = logging.getLogger("edgeserve")


def serve(settings: Settings) -> int:
    """Serve until SIGTERM/SIGINT; return the process exit code (2 when the model fails)."""
    return asyncio.run(_serve(settings))


async def _serve(settings: Settings) -> int:
    engine = Engine(settings.engine_config())
    client = EngineClient(engine)
    app = create_app(settings, client)
    runner = web.AppRunner(
        app,
        handler_cancellation=True,
        shutdown_timeout=settings.drain_timeout_s,
        access_log=None,
    )
    await runner.setup()
    site = web.TCPSite(runner, settings.host, settings.port)
    try:
        await site.start()
    except OSError as exc:
        await runner.cleanup()
        print(
            f"edgeserve: error: cannot listen on {settings.host}:{settings.port}: {exc.strerror}",
            file=sys.stderr,
        )
        return 2
    log.info("listening on http://%s:%d (loading %s)", settings.host, settings.port, settings.model)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    engine.start()
    loading = asyncio.ensure_future(asyncio.to_thread(engine.wait_loaded))
    stopping = asyncio.ensure_future(stop.wait())
    await asyncio.wait({loading, stopping}, return_when=asyncio.FIRST_COMPLETED)
    code = 0
    if loading.done() and not loading.result():
        print(f"edgeserve: error: cannot load the model: {engine.load_error}", file=sys.stderr)
        code = 2
    elif loading.done():
        log.info("model loaded; ready")
        engine_ended = asyncio.ensure_future(asyncio.to_thread(engine.wait_stopped))
        await asyncio.wait({stopping, engine_ended}, return_when=asyncio.FIRST_COMPLETED)
        if engine_ended.done() and not stopping.done():
            log.error("the engine thread stopped unexpectedly; exiting so a supervisor restarts us")
            code = 1
    stopping.cancel()
    log.info("shutting down: draining running requests (up to %.0fs)", settings.drain_timeout_s)
    engine.stop_accepting()
    await runner.cleanup()
    await asyncio.to_thread(engine.close)
    loading.cancel()
    return code
