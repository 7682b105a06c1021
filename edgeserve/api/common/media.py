"""Media in a conversation, in two passes.

First, in the request's order, each media item is checked as the reference checks it (data URI,
existing local file, remote URL: E7–E13) and becomes a `MediaSource`, its place in the text a
MEDIA_MARKER; media the model does not take are refused later (`media_refusal`, after every
check the reference makes). Then, once every check has passed, `read_turns` reads the sources
(a data URI's bytes, a local file, a download through `Limits.fetcher`) under the count and
size limits, into the engine's `ChatTurn`s.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import ipaddress
import os
import re
import socket
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final
from urllib.parse import urlparse

from edgeserve import errors
from edgeserve.api.common.wire import MultimodalInputItem
from edgeserve.api.reference.detail import Detail
from edgeserve.api.reference.fetcher import FetchError
from edgeserve.api.reference.limits import Limits, bad
from edgeserve.engine.types import MEDIA_MARKER, ChatTurn, Media, MediaKind

# The reference's data URIs (case-sensitive, whole string); with a model that takes the kind,
# also webp images and flac audio (README divergence 19).
_IMAGE_TYPES = "png|jpg|jpeg|gif|bmp"
_AUDIO_TYPES = "mpeg|mp3|wav|ogg"
_DATA_URI: Final = {
    "image_url": re.compile(rf"^data:image\/({_IMAGE_TYPES});base64,(.+)$"),
    "video_url": re.compile(r"^data:video\/(mp4|mkv|avi|mov);base64,(.+)$"),
    "audio_url": re.compile(rf"^data:audio\/({_AUDIO_TYPES});base64,(.+)$"),
}
_DATA_URI_TAKEN: Final = {
    "image_url": re.compile(rf"^data:image\/({_IMAGE_TYPES}|webp);base64,(.+)$"),
    "audio_url": re.compile(rf"^data:audio\/({_AUDIO_TYPES}|flac);base64,(.+)$"),
}
_KIND: Final[dict[str, MediaKind]] = {
    "image_url": "image",
    "audio_url": "audio",
    "input_audio": "audio",
}
_WHAT: Final = {"image": "an image", "audio": "audio"}
_PLURAL: Final = {"image": "images", "audio": "audio"}


@dataclass(frozen=True)
class MediaSource:
    """A media item that passed its checks, not read yet: its bytes at hand (`data`, from a
    data URI or base64), a local file inside the safe folder (`path`), or an http(s) `url`.
    `where` names the item in messages ("messages[0].content[1]")."""

    kind: MediaKind
    where: str
    data: bytes | None = None
    path: str | None = None
    url: str | None = None


@dataclass(frozen=True)
class PendingTurn:
    """A turn whose media are still to be read: `content` holds one MEDIA_MARKER per source,
    in order."""

    role: str
    content: str
    sources: tuple[MediaSource, ...] = ()


async def flatten(
    items: list[MultimodalInputItem], index: int, limits: Limits, late: list[str]
) -> tuple[str, list[MediaSource]]:
    """Content items as one text (each media item a MEDIA_MARKER) and its media, each item
    checked in the reference's order; refusals the reference never makes go to `late`."""
    parts: list[str] = []
    sources: list[MediaSource] = []
    for number, item in enumerate(items):
        where = f"messages[{index}].content[{number}]"
        if item.type == "text":
            if item.text is None:
                raise bad(Detail.TEXT_WITHOUT_TEXT.format(where=where))
            parts.append(item.text)
            continue
        if item.type == "input_audio":
            source: MediaSource | None = _input_audio(item, where)
        else:
            url = getattr(item, item.type)
            if url is None:
                raise bad(Detail.MEDIA_WITHOUT_URL.format(where=where, kind=item.type))
            source = await _check_media_url(item.type, url.url, where, limits)
        refusal = (
            Detail.VIDEO_UNSUPPORTED.format(where=where)
            if source is None
            else media_refusal(source.kind, where, limits)
        )
        if refusal is not None:
            late.append(refusal)
        elif source is not None:
            parts.append(MEDIA_MARKER)
            sources.append(source)
    return "".join(parts), sources


def media_refusal(kind: MediaKind, where: str, limits: Limits) -> str | None:
    """Why the model cannot take the `kind` item at `where`; None when it can."""
    if kind in limits.media_kinds:
        return None
    if not limits.media_kinds:
        return Detail.MEDIA_TEXT_ONLY.format(where=where, what=_WHAT[kind], plural=_PLURAL[kind])
    takes = " and ".join(_PLURAL[k] for k in ("image", "audio") if k in limits.media_kinds)
    return Detail.MEDIA_KIND_UNSUPPORTED.format(
        where=where, what=_WHAT[kind], takes=takes, kind=kind
    )


def input_modalities(kinds: frozenset[MediaKind]) -> list[str]:
    """What a model takes, as /health, /v1/models and /tokenizer_info list it."""
    return ["text", *(kind for kind in ("image", "audio") if kind in kinds)]


def decode_base64(payload: str) -> bytes | None:
    """`payload` decoded as the reference decodes data URIs (characters outside the alphabet
    skipped); None when that fails or yields nothing."""
    try:
        return base64.b64decode(payload) or None
    except (binascii.Error, ValueError):
        return None


def _input_audio(item: MultimodalInputItem, where: str) -> MediaSource:
    """OpenAI's `input_audio` item (base64 data), decoded."""
    audio = item.input_audio
    if audio is None:
        raise bad(Detail.INPUT_AUDIO_WITHOUT_AUDIO.format(where=where))
    data = decode_base64(audio.data)
    if data is None:
        raise bad(Detail.BAD_BASE64.format(where=f"{where}.input_audio.data"))
    return MediaSource("audio", where, data=data)


async def _check_media_url(
    item_type: str, url: str, where: str, limits: Limits
) -> MediaSource | None:
    """The reference's per-item order: data URI, existing local file, then remote URL. The
    item's source, or None for a video (checked, never taken)."""
    kind = _KIND.get(item_type)
    taken = kind is not None and kind in limits.media_kinds
    match = (_DATA_URI_TAKEN if taken else _DATA_URI)[item_type].match(url)
    if match:
        data = decode_base64(match.group(2))
        if data is None:
            raise bad(Detail.BAD_DATA_URI.format(where=where, kind=item_type))
        return MediaSource(kind, where, data=data) if kind else None
    if os.path.isfile(url):
        path = _check_local_file(url, limits)
        return MediaSource(kind, where, path=path) if kind else None
    await check_remote_url(url, limits)
    return MediaSource(kind, where, url=url) if kind else None


def _check_local_file(path: str, limits: Limits) -> str:
    """E7/E8; the file's real path. Containment is a real path-component check (the
    reference's plain prefix test also admits sibling folders such as safe_media_x); the safe
    folder is never created."""
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
    return real


async def check_remote_url(url: str, limits: Limits) -> None:
    """E9–E13 (E11 skipped with allow_private_media_urls). Resolves the host on the loop's
    executor; the download (`Limits.fetcher`) vets every address it connects to again."""
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
    if not address.is_global and not limits.allow_private_media_urls:
        raise bad(Detail.URL_PRIVATE)


async def read_turns(turns: Sequence[PendingTurn], limits: Limits) -> tuple[ChatTurn, ...]:
    """The turns with their media read (see read_media)."""
    media = iter(await read_media([s for turn in turns for s in turn.sources], limits))
    return tuple(
        ChatTurn(turn.role, turn.content, tuple(next(media) for _ in turn.sources))
        for turn in turns
    )


async def read_media(sources: Sequence[MediaSource], limits: Limits) -> list[Media]:
    """Every source's bytes, files and downloads read at once: 400 for more sources than
    max_media_items, 413 for one over max_media_bytes, 400 for one that cannot be read or
    downloaded (the first in order)."""
    if len(sources) > limits.max_media_items:
        detail = Detail.TOO_MANY_MEDIA.format(count=len(sources), limit=limits.max_media_items)
        raise bad(detail)
    tasks = [asyncio.ensure_future(_read(source, limits)) for source in sources]
    try:
        return [await task for task in tasks]
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def _read(source: MediaSource, limits: Limits) -> Media:
    if source.data is not None:
        data = source.data
    elif source.path is not None:
        data = await asyncio.to_thread(_read_file, source, limits)
    else:
        data = await _download(source, limits)
    if len(data) > limits.max_media_bytes:
        raise _too_large(source, limits)
    return Media(source.kind, data)


def _read_file(source: MediaSource, limits: Limits) -> bytes:
    """A local file's bytes, no more than one past the limit."""
    assert source.path is not None
    try:
        with open(source.path, "rb") as file:
            return file.read(limits.max_media_bytes + 1)
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise bad(
            Detail.MEDIA_READ_FAILED.format(where=source.where, kind=source.kind, reason=reason)
        ) from None


async def _download(source: MediaSource, limits: Limits) -> bytes:
    assert source.url is not None
    if limits.fetcher is None:
        reason = "this server downloads no media URLs"
    else:
        try:
            return await limits.fetcher.fetch(source.url, limits.max_media_bytes)
        except FetchError as exc:
            if exc.too_large:
                raise _too_large(source, limits) from None
            reason = exc.reason
    raise bad(Detail.MEDIA_FETCH_FAILED.format(where=source.where, kind=source.kind, reason=reason))


def _too_large(source: MediaSource, limits: Limits) -> errors.ApiError:
    detail = Detail.MEDIA_TOO_LARGE.format(
        where=source.where, kind=source.kind, limit=limits.max_media_bytes
    )
    return errors.ApiError(413, detail)
