"""The chat page at `/` (`--no-webui` leaves it out): the files of `edgeserve/http/webui/`,
shipped in the package, read once and served with their type, an ETag (answered 304 when the
browser's copy is current) and a strict Content-Security-Policy. The page itself needs no API
key (it asks for one when the API answers 401); it talks only to this server's own API."""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import resources
from pathlib import PurePosixPath

from aiohttp import web
from aiohttp.helpers import ETAG_ANY
from aiohttp.typedefs import Handler

INDEX = "index.html"
ASSET_PREFIX = "/webui/"

CONTENT_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".svg": "image/svg+xml",
}

CONTENT_SECURITY_POLICY = "; ".join(
    [
        "default-src 'none'",
        "script-src 'self'",
        "style-src 'self'",
        "img-src 'self' data: blob:",
        "connect-src 'self'",
        "base-uri 'none'",
        "form-action 'none'",
        "frame-ancestors 'none'",
    ]
)
"""Scripts, styles and API calls from this server only, nothing inline; images may also be the
data URLs of attached pictures; no page may frame it."""

SECURITY_HEADERS = {
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
}


@dataclass(frozen=True)
class Asset:
    """One file of the page: its bytes, type and ETag (a hash of the bytes)."""

    body: bytes
    content_type: str
    digest: str

    @classmethod
    def of(cls, name: str, body: bytes) -> Asset:
        digest = hashlib.sha256(body).hexdigest()[:20]
        return cls(body, CONTENT_TYPES[PurePosixPath(name).suffix], digest)

    def current(self, request: web.Request) -> bool:
        """Whether the browser's copy is this one (If-None-Match names its ETag, or `*`)."""
        return any(tag.value in (self.digest, ETAG_ANY) for tag in request.if_none_match or ())

    def headers(self) -> dict[str, str]:
        """Revalidated on every load (`no-cache` with the ETag): a page never outlives an
        upgrade of the server, and a current copy costs a 304."""
        return {
            **SECURITY_HEADERS,
            "Content-Type": self.content_type,
            "Cache-Control": "no-cache",
            "ETag": f'"{self.digest}"',
        }


@functools.cache
def load_assets() -> Mapping[str, Asset]:
    """Every file of the page by name (files of other types are not served), read once."""
    folder = resources.files(__package__).joinpath("webui")
    return {
        item.name: Asset.of(item.name, item.read_bytes())
        for item in folder.iterdir()
        if item.is_file() and PurePosixPath(item.name).suffix in CONTENT_TYPES
    }


def asset_handler(asset: Asset) -> Handler:
    """GET of one file; 304 when If-None-Match names its ETag."""

    async def handle(request: web.Request) -> web.Response:
        headers = asset.headers()
        if asset.current(request):
            del headers["Content-Type"]
            return web.Response(status=304, headers=headers)
        return web.Response(body=asset.body, headers=headers)

    return handle


def add_routes(router: web.UrlDispatcher, prefix: str, assets: Mapping[str, Asset]) -> set[str]:
    """`prefix/` (the page) and `prefix/webui/<file>` for each file; the paths added."""
    paths = {prefix + "/"} | {prefix + ASSET_PREFIX + name for name in assets if name != INDEX}
    for path in sorted(paths):
        name = INDEX if path.endswith("/") else path.rsplit("/", 1)[1]
        router.add_get(path, asset_handler(assets[name]), allow_head=False)
    return paths
