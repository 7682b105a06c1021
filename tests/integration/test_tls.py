"""TLS on the real `edgeserve serve` process: the openai SDK over HTTPS with an httpx client that
trusts the test CA, /health over HTTPS, client certificates with --ssl-ca-certs, and a bad
certificate/key pair refused at startup (exit 2, one line)."""

from __future__ import annotations

import asyncio
import ssl

import aiohttp
import httpx
import openai
import pytest

from tests.integration.test_server_process import Server, server_factory
from tests.tls_certs import Certificates

__all__ = ["server_factory"]

USER = {"role": "user", "content": "Say hi."}


def trusting(certificates: Certificates, *, with_client_cert: bool = False) -> ssl.SSLContext:
    """A client context that trusts the test CA (and presents the client certificate)."""
    context = ssl.create_default_context(cafile=str(certificates.ca))
    if with_client_cert:
        context.load_cert_chain(certificates.client_cert, certificates.client_key)
    return context


async def start(server: Server, context: ssl.SSLContext) -> None:
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=context)) as session:
        await server.wait_ready(session)


def tls_args(certificates: Certificates, *more: str) -> tuple[str, ...]:
    c = certificates
    return ("--ssl-certfile", str(c.server_cert), "--ssl-keyfile", str(c.server_key), *more)


async def test_openai_sdk_over_https(server_factory, certificates):
    server = server_factory(*tls_args(certificates, "--api-key", "secret"))
    assert server.url.startswith("https://127.0.0.1:")
    await start(server, trusting(certificates))

    def talk() -> None:
        with httpx.Client(verify=trusting(certificates), timeout=60) as http:
            health = http.get(f"{server.url}/health")
            assert health.status_code == 200
            assert health.json()["status"] == "ok"
            sdk = openai.OpenAI(
                base_url=f"{server.url}/v1", api_key="secret", http_client=http, max_retries=0
            )
            reply = sdk.chat.completions.create(model="m", messages=[USER], max_tokens=4)
            assert reply.choices[0].message.content
            chunks = list(
                sdk.chat.completions.create(model="m", messages=[USER], max_tokens=4, stream=True)
            )
            reasons = [chunk.choices[0].finish_reason for chunk in chunks if chunk.choices]
            assert reasons[-1] in ("stop", "length")
            wrong = sdk.with_options(api_key="wrong")
            with pytest.raises(openai.AuthenticationError):
                wrong.models.list()
        with httpx.Client() as untrusting, pytest.raises(httpx.ConnectError, match="CERTIFICATE"):
            untrusting.get(f"{server.url}/health")
        with httpx.Client() as plain, pytest.raises(httpx.TransportError):
            plain.get(f"http://127.0.0.1:{server.port}/health")

    await asyncio.to_thread(talk)
    code, err = server.stop()
    assert code == 0, err
    assert f"listening on https://127.0.0.1:{server.port}" in err


async def test_client_certificates_with_a_ca_file(server_factory, certificates):
    server = server_factory(*tls_args(certificates, "--ssl-ca-certs", str(certificates.ca)))
    await start(server, trusting(certificates, with_client_cert=True))

    def talk() -> None:
        with httpx.Client(verify=trusting(certificates, with_client_cert=True)) as http:
            sdk = openai.OpenAI(
                base_url=f"{server.url}/v1", api_key="x", http_client=http, max_retries=0
            )
            assert [model.id for model in sdk.models.list()]
        anonymous = httpx.Client(verify=trusting(certificates))
        with anonymous, pytest.raises(httpx.TransportError):
            anonymous.get(f"{server.url}/health")

    await asyncio.to_thread(talk)
    assert server.stop()[0] == 0


@pytest.mark.parametrize("problem", ["mismatched", "missing"])
def test_a_bad_certificate_and_key_exit_2_with_one_line(
    tmp_path, server_factory, certificates, problem
):
    c = certificates
    key = c.other_key if problem == "mismatched" else tmp_path / "none.key"
    server = server_factory("--ssl-certfile", str(c.server_cert), "--ssl-keyfile", str(key))
    _, err = server.proc.communicate(timeout=60)
    assert server.proc.returncode == 2
    expected = {
        "mismatched": f"--ssl-certfile {c.server_cert} and --ssl-keyfile {key} do not match: "
        "the key is not the certificate's",
        "missing": f"cannot read --ssl-keyfile {key}: No such file or directory",
    }[problem]
    assert err == f"edgeserve: error: {expected}\n"
