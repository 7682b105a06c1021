"""edgeserve.tls: the server's SSL context from the settings, and its one-line errors."""

from __future__ import annotations

import ssl
from pathlib import Path

import pytest

from edgeserve.config import ConfigError, Settings
from edgeserve.tls import server_context
from tests.tls_certs import Certificates


def tls(cert: Path, key: Path | None = None, ca: Path | None = None) -> Settings:
    return Settings(
        model="m.gguf",
        ssl_certfile=str(cert),
        ssl_keyfile=None if key is None else str(key),
        ssl_ca_certs=None if ca is None else str(ca),
    )


def test_no_certificate_is_plain_http():
    assert server_context(Settings(model="m.gguf")) is None


def test_certificate_and_key(certificates: Certificates):
    context = server_context(tls(certificates.server_cert, certificates.server_key))
    assert isinstance(context, ssl.SSLContext)
    assert context.verify_mode == ssl.CERT_NONE
    assert context.minimum_version == ssl.TLSVersion.TLSv1_2


def test_key_inside_the_certificate_file(tmp_path, certificates: Certificates):
    both = tmp_path / "both.pem"
    both.write_bytes(certificates.server_cert.read_bytes() + certificates.server_key.read_bytes())
    assert server_context(tls(both)) is not None


def test_ca_file_requires_client_certificates(certificates: Certificates):
    c = certificates
    context = server_context(tls(c.server_cert, c.server_key, c.ca))
    assert context is not None
    assert context.verify_mode == ssl.CERT_REQUIRED
    # only the given CA: not the system's store
    assert [cert["subject"] for cert in context.get_ca_certs()] == [
        ((("commonName", "edgeserve test CA"),),)
    ]


def error_of(settings: Settings) -> str:
    with pytest.raises(ConfigError) as caught:
        server_context(settings)
    message = str(caught.value)
    assert "\n" not in message
    return message


def test_mismatched_pair(certificates: Certificates):
    c = certificates
    assert error_of(tls(c.server_cert, c.other_key)) == (
        f"--ssl-certfile {c.server_cert} and --ssl-keyfile {c.other_key} do not match: the key "
        "is not the certificate's"
    )


@pytest.mark.parametrize("which", ["cert", "key", "ca"])
def test_unreadable_file(tmp_path, certificates: Certificates, which):
    c = certificates
    missing = tmp_path / "missing.pem"
    files = {"cert": c.server_cert, "key": c.server_key, "ca": c.ca, which: missing}
    flag = {"cert": "--ssl-certfile", "key": "--ssl-keyfile", "ca": "--ssl-ca-certs"}[which]
    message = error_of(tls(files["cert"], files["key"], files["ca"]))
    assert message == f"cannot read {flag} {missing}: No such file or directory"


def test_folder_instead_of_file(tmp_path, certificates: Certificates):
    message = error_of(tls(tmp_path, certificates.server_key))
    assert message == f"cannot read --ssl-certfile {tmp_path}: Is a directory"


def test_encrypted_key(certificates: Certificates):
    c = certificates
    message = error_of(tls(c.server_cert, c.encrypted_key))
    assert message.startswith(f"--ssl-keyfile {c.encrypted_key} is encrypted;")


def test_not_pem(tmp_path, certificates: Certificates):
    junk = tmp_path / "junk.pem"
    junk.write_text("not a certificate\n")
    message = error_of(tls(junk, certificates.server_key))
    assert message.startswith(f"cannot load --ssl-certfile {junk} with --ssl-keyfile ")
    assert "_ssl.c" not in message
    assert error_of(tls(certificates.server_cert)).startswith(
        f"cannot load --ssl-certfile {certificates.server_cert}: without --ssl-keyfile it must "
        "hold a PEM certificate and its PEM private key ("
    )


def test_ca_file_without_certificates(tmp_path, certificates: Certificates):
    junk = tmp_path / "ca.pem"
    junk.write_text("not a certificate\n")
    message = error_of(tls(certificates.server_cert, certificates.server_key, junk))
    assert message.startswith(f"cannot load --ssl-ca-certs {junk}: it must hold PEM CA")
