"""The server's TLS context from `--ssl-certfile`, `--ssl-keyfile` and `--ssl-ca-certs`."""

from __future__ import annotations

import re
import ssl
from pathlib import Path

from edgeserve.config import ConfigError, Settings


class _EncryptedKey(Exception):
    """Raised by the password callback: the key file asks for a passphrase."""


def _no_passphrase() -> bytes:
    raise _EncryptedKey


def _readable(flag: str, path: str) -> None:
    try:
        with Path(path).open("rb") as fh:
            fh.read(1)
    except OSError as exc:
        raise ConfigError(f"cannot read {flag} {path}: {exc.strerror or exc}") from None


def _reason(exc: ssl.SSLError) -> str:
    """OpenSSL's words without CPython's `(_ssl.c:1234)` suffix."""
    return re.sub(r"\s*\(_ssl\.c:\d+\)$", "", exc.strerror or str(exc))


def _load_error(certfile: str, keyfile: str | None, exc: ssl.SSLError) -> str:
    """The one-line message for a certificate and key that OpenSSL refused."""
    if keyfile is None:
        if exc.reason == "KEY_VALUES_MISMATCH":
            return f"--ssl-certfile {certfile} holds a key that is not the certificate's"
        return (
            f"cannot load --ssl-certfile {certfile}: without --ssl-keyfile it must hold a PEM "
            f"certificate and its PEM private key ({_reason(exc)})"
        )
    if exc.reason == "KEY_VALUES_MISMATCH":
        return (
            f"--ssl-certfile {certfile} and --ssl-keyfile {keyfile} do not match: the key is "
            "not the certificate's"
        )
    return (
        f"cannot load --ssl-certfile {certfile} with --ssl-keyfile {keyfile}: they must be a PEM "
        f"certificate and its PEM private key ({_reason(exc)})"
    )


def server_context(settings: Settings) -> ssl.SSLContext | None:
    """The SSL context to serve with, or None for plain HTTP.

    Raises ConfigError (one line) for an unreadable, unparsable, encrypted or mismatched
    certificate and key, or an unusable CA file."""
    if settings.ssl_certfile is None:
        return None
    certfile, keyfile = settings.ssl_certfile, settings.ssl_keyfile
    _readable("--ssl-certfile", certfile)
    if keyfile is not None:
        _readable("--ssl-keyfile", keyfile)
    # Not create_default_context: it would trust the system's CAs for client certificates.
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_cert_chain(certfile, keyfile, password=_no_passphrase)
    except _EncryptedKey:
        where = f"--ssl-keyfile {keyfile}" if keyfile else f"the key in --ssl-certfile {certfile}"
        raise ConfigError(
            f"{where} is encrypted; give an unencrypted key (openssl pkey -in KEY -out NEW)"
        ) from None
    except ssl.SSLError as exc:
        raise ConfigError(_load_error(certfile, keyfile, exc)) from None
    if settings.ssl_ca_certs is not None:
        _readable("--ssl-ca-certs", settings.ssl_ca_certs)
        try:
            context.load_verify_locations(cafile=settings.ssl_ca_certs)
        except ssl.SSLError as exc:
            raise ConfigError(
                f"cannot load --ssl-ca-certs {settings.ssl_ca_certs}: it must hold PEM CA "
                f"certificates ({_reason(exc)})"
            ) from None
        context.verify_mode = ssl.CERT_REQUIRED
    return context
