"""Certificates for the TLS tests, made with the system's `openssl` (`make test` installs it when
missing): a CA, a server certificate for localhost and 127.0.0.1, a client certificate, a key
that matches neither, and that key encrypted."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path

_EC = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes"]
_LEAF = (
    "basicConstraints=critical,CA:FALSE\n"
    "subjectKeyIdentifier=hash\n"
    "authorityKeyIdentifier=keyid,issuer\n"
    "keyUsage=critical,digitalSignature\n"
)


@dataclass(frozen=True)
class Certificates:
    """PEM files in one folder."""

    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    other_key: Path
    encrypted_key: Path


def _openssl(folder: Path, *args: str) -> None:
    subprocess.run(["openssl", *args], cwd=folder, check=True, capture_output=True, timeout=60)


def _leaf(folder: Path, name: str, subject: str, extensions: str) -> None:
    """`name`.pem and `name`.key, signed by ca.pem."""
    (folder / f"{name}.ext").write_text(_LEAF + extensions)
    _openssl(
        folder,
        "req",
        "-new",
        *_EC,
        "-keyout",
        f"{name}.key",
        "-out",
        f"{name}.csr",
        "-subj",
        subject,
    )
    _openssl(
        folder,
        "x509",
        "-req",
        "-in",
        f"{name}.csr",
        "-CA",
        "ca.pem",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-days",
        "2",
        "-out",
        f"{name}.pem",
        "-extfile",
        f"{name}.ext",
    )


def make_certificates(folder: Path) -> Certificates:
    """A fresh CA and the certificates it signs, in `folder`."""
    _openssl(
        folder,
        "req",
        "-x509",
        *_EC,
        "-keyout",
        "ca.key",
        "-out",
        "ca.pem",
        "-days",
        "2",
        "-subj",
        "/CN=edgeserve test CA",
        "-addext",
        "basicConstraints=critical,CA:TRUE",
        "-addext",
        "keyUsage=critical,keyCertSign,cRLSign",
    )
    server = "subjectAltName=DNS:localhost,IP:127.0.0.1\nextendedKeyUsage=serverAuth\n"
    _leaf(folder, "server", "/CN=localhost", server)
    _leaf(folder, "client", "/CN=edgeserve test client", "extendedKeyUsage=clientAuth\n")
    _openssl(
        folder,
        "genpkey",
        "-algorithm",
        "EC",
        "-pkeyopt",
        "ec_paramgen_curve:P-256",
        "-out",
        "other.key",
    )
    _openssl(
        folder,
        "pkey",
        "-in",
        "other.key",
        "-aes256",
        "-passout",
        "pass:secret",
        "-out",
        "encrypted.key",
    )
    return Certificates(
        ca=folder / "ca.pem",
        server_cert=folder / "server.pem",
        server_key=folder / "server.key",
        client_cert=folder / "client.pem",
        client_key=folder / "client.key",
        other_key=folder / "other.key",
        encrypted_key=folder / "encrypted.key",
    )
