"""Chat's multimodal content: items flattened to text with placeholders, each media URL checked
in the reference's order (data URI, local file, remote URL: E7–E13)."""

from __future__ import annotations

import asyncio
import base64
import binascii
import ipaddress
import os
import re
import socket
from typing import Final
from urllib.parse import urlparse

from edgeserve import errors
from edgeserve.api.common.wire import MultimodalInputItem
from edgeserve.api.reference.detail import Detail
from edgeserve.api.reference.limits import Limits, bad

_DATA_URI: Final = {
    "image_url": re.compile(r"^data:image\/(png|jpg|jpeg|gif|bmp);base64,(.+)$"),
    "video_url": re.compile(r"^data:video\/(mp4|mkv|avi|mov);base64,(.+)$"),
    "audio_url": re.compile(r"^data:audio\/(mpeg|mp3|wav|ogg);base64,(.+)$"),
}
_MEDIA_NAME: Final = {"image_url": "image", "video_url": "video", "audio_url": "audio"}


async def flatten(
    items: list[MultimodalInputItem], index: int, limits: Limits, late: list[str]
) -> str:
    """Content items as one text (media items as placeholders), each checked; errors the
    reference reports later go to `late`."""
    parts = []
    for number, item in enumerate(items):
        where = f"messages[{index}].content[{number}]"
        if item.type == "text":
            if item.text is None:
                raise bad(Detail.TEXT_WITHOUT_TEXT.format(where=where))
            parts.append(item.text)
            continue
        url = getattr(item, item.type)
        if url is None:
            raise bad(Detail.MEDIA_WITHOUT_URL.format(where=where, kind=item.type))
        parts.append(limits.placeholder(item.type))
        await _check_media_url(item.type, url.url, where, limits)
        if not limits.accepts(item.type):
            late.append(Detail.MEDIA_UNSUPPORTED.format(media=_MEDIA_NAME[item.type], where=where))
    return "".join(parts)


async def _check_media_url(kind: str, url: str, where: str, limits: Limits) -> None:
    """The reference's per-item order: data URI, existing local file, then remote URL."""
    if _DATA_URI[kind].match(url):
        if not _decodes_to_data(url.split(",", 1)[1]):
            raise bad(Detail.BAD_DATA_URI.format(where=where, kind=kind))
        return
    if os.path.isfile(url):
        _check_local_file(url, limits)
        return
    await _check_remote_url(url)


def _decodes_to_data(payload: str) -> bool:
    """Whether the reference's lenient base64 decode succeeds and yields some bytes."""
    try:
        return bool(base64.b64decode(payload))
    except (binascii.Error, ValueError):
        return False


def _check_local_file(path: str, limits: Limits) -> None:
    """E7/E8. Containment is a real path-component check (the reference's plain prefix test
    also admits sibling folders such as safe_media_x); the safe folder is never created."""
    if not limits.allow_local_files:
        raise errors.ApiError(403, Detail.LOCAL_FILES_DISABLED)
    try:
        real = os.path.realpath(path)
        safe = os.path.realpath(limits.safe_media_path)
        inside = os.path.commonpath([real, safe]) == safe
    except (OSError, ValueError):
        inside = False
    if not inside:
        raise bad(Detail.INVALID_FILE_PATH)


async def _check_remote_url(url: str) -> None:
    """E9–E13. Resolves the host on the loop's executor; never fetches the URL."""
    try:
        parsed = urlparse(url)
        if parsed.scheme not in ("http", "https"):
            raise bad(Detail.URL_SCHEME)
        hostname = parsed.hostname
        if not hostname:
            raise bad(Detail.URL_HOSTNAME)
        port = parsed.port
        try:
            infos = await asyncio.get_running_loop().getaddrinfo(hostname, port)
        except socket.gaierror:
            raise bad(Detail.URL_UNRESOLVABLE.format(host=hostname)) from None
        address = ipaddress.ip_address(infos[0][4][0])
    except errors.ApiError:
        raise
    except Exception as exc:  # the reference reports any other failure as E13
        raise bad(Detail.URL_OTHER.format(error=exc)) from exc
    if not address.is_global:
        raise bad(Detail.URL_PRIVATE)
