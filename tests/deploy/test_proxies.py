"""deploy/nginx.conf and deploy/haproxy.cfg: syntax, and nginx in front of two instances."""

from __future__ import annotations

import asyncio
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from tests.system_tools import require

REPO = Path(__file__).resolve().parents[2]
NGINX_CONF = REPO / "deploy" / "nginx.conf"
HAPROXY_CFG = REPO / "deploy" / "haproxy.cfg"
SEEN = web.AppKey("seen", list)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def local_nginx_conf(tmp_path: Path, listen: int, upstreams: tuple[int, int]) -> Path:
    """The example with our ports, and every path nginx writes moved into `tmp_path`."""
    text = NGINX_CONF.read_text()
    text = text.replace("listen 8080;", f"listen 127.0.0.1:{listen};")
    text = text.replace("127.0.0.1:8001", f"127.0.0.1:{upstreams[0]}")
    text = text.replace("127.0.0.1:8002", f"127.0.0.1:{upstreams[1]}")
    temp = "".join(
        f"    {kind}_temp_path {tmp_path}/{kind};\n"
        for kind in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi")
    )
    text = text.replace("http {\n", f"http {{\n    access_log off;\n{temp}", 1)
    conf = tmp_path / "nginx.conf"
    conf.write_text(f"pid {tmp_path}/nginx.pid;\nerror_log stderr;\n{text}")
    return conf


def nginx(tmp_path: Path, conf: Path, *args: str) -> list[str]:
    return ["nginx", "-p", str(tmp_path), "-e", "stderr", "-c", str(conf), *args]


def test_nginx_example_passes_nginx_t(tmp_path):
    require("nginx", "nginx-light")
    done = subprocess.run(
        nginx(tmp_path, NGINX_CONF, "-t", "-g", f"pid {tmp_path}/nginx.pid;"),
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 0, done.stderr
    assert "syntax is ok" in done.stderr


def test_nginx_example_balances_by_least_connections_and_retries_503():
    text = NGINX_CONF.read_text()
    assert "least_conn;" in text
    assert "proxy_next_upstream error timeout http_503 non_idempotent;" in text
    assert "proxy_buffering off;" in text


def test_haproxy_example_is_valid():
    require("haproxy", "haproxy")
    done = subprocess.run(
        ["haproxy", "-c", "-f", str(HAPROXY_CFG)], capture_output=True, text=True, timeout=30
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "option httpchk GET /health" in HAPROXY_CFG.read_text()


def stub_app(name: str, status: int) -> web.Application:
    """An instance that answers every request with `status` and says who it is."""
    seen: list[str] = []

    async def answer(request: web.Request) -> web.Response:
        await request.read()
        seen.append(request.headers.get("X-Request-Id", ""))
        return web.json_response({"instance": name}, status=status)

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", answer)
    app[SEEN] = seen
    return app


@pytest.fixture
def nginx_proxy(tmp_path) -> Iterator[tuple[int, tuple[int, int]]]:
    """nginx with the example config on a free port, in front of two free upstream ports."""
    require("nginx", "nginx-light")
    listen, upstreams = free_port(), (free_port(), free_port())
    conf = local_nginx_conf(tmp_path, listen, upstreams)
    proc = subprocess.Popen(
        nginx(tmp_path, conf, "-g", "daemon off; master_process on;"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        for _ in range(100):
            assert proc.poll() is None, proc.communicate()[1]
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", listen)) == 0:
                    break
            time.sleep(0.05)
        yield listen, upstreams
    finally:
        proc.terminate()
        proc.communicate(timeout=30)


async def test_nginx_sends_a_503ed_request_to_the_other_instance(nginx_proxy):
    listen, (port_a, port_b) = nginx_proxy
    draining = web.AppRunner(stub_app("a", 503))
    ready = web.AppRunner(stub_app("b", 200))
    await draining.setup()
    await ready.setup()
    await web.TCPSite(draining, "127.0.0.1", port_a).start()
    await web.TCPSite(ready, "127.0.0.1", port_b).start()
    try:
        async with aiohttp.ClientSession() as session:
            url = f"http://127.0.0.1:{listen}/v1/chat/completions"
            for i in range(6):
                headers = {"X-Request-Id": f"req-{i}"}
                async with session.post(url, json={"model": "m"}, headers=headers) as resp:
                    assert resp.status == 200
                    assert (await resp.json())["instance"] == "b"
        assert draining.app[SEEN], "nginx never tried the 503 instance"
        assert ready.app[SEEN] == [f"req-{i}" for i in range(6)]
    finally:
        await draining.cleanup()
        await ready.cleanup()
        await asyncio.sleep(0)
