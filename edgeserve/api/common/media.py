"""Media in a conversation, in two passes.

First, in the request's order, each media item is checked as the reference checks it (data URI,
existing local file, remote URL: E7–E13) and becomes a `MediaSource`, its place in the text a
MEDIA_MARKER; media the model does not take are refused later (`media_refusal`, after every
check the reference makes). Then, once every check has passed, `read_turns` reads the sources
(a data URI's bytes, a local file, a download through `Limits.fetcher`) under the count and
size limits, into the engine's `ChatTurn`s.

Where the reference's order would let a client make the server work for media it will refuse,
or tell what exists on its disk, the checks diverge (README divergence 21): a host name is
looked up (E11/E12) only for an item the model takes, in a request within
--max-media-per-request; with local files disabled, nothing on disk is looked at.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import ipaddress
import os
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Final
from urllib.parse import urlparse, urlsplit

from edgeserve import errors
from edgeserve.api.common.addresses import IPAddress, NumericHost, is_public, literal_address
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


def taken_media(items: Iterable[MultimodalInputItem], limits: Limits) -> int:
    """How many of `items` are media the model takes (what --max-media-per-request counts)."""
    return sum(_KIND.get(item.type) in limits.media_kinds for item in items)


async def flatten(
    items: list[MultimodalInputItem], index: int, limits: Limits, late: list[str], lookups: bool
) -> tuple[str, list[MediaSource]]:
    """Content items as one text (each media item a MEDIA_MARKER) and its media, each item
    checked in the reference's order; refusals the reference never makes go to `late`. Host
    names are looked up only with `lookups` (false when the request holds more media than
    the limit: it is refused anyway), and only for media the model takes."""
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
            source = await _check_media_url(item.type, url.url, where, limits, lookups)
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
    item_type: str, url: str, where: str, limits: Limits, lookups: bool
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
    path = _local_file(url, limits)
    if path is not None:
        return MediaSource(kind, where, path=path) if kind else None
    await check_remote_url(url, limits, lookup=taken and lookups)
    return MediaSource(kind, where, url=url) if kind else None


def _local_file(url: str, limits: Limits) -> str | None:
    """E7/E8 for a local file: its real path, or None when `url` is not one. With local files
    disabled nothing on disk is looked at: every string without a URL scheme is refused (E7)
    whether or not such a file exists (the reference refuses only an existing one, and so
    tells a client which files exist)."""
    if not limits.allow_local_files:
        if url and not _has_scheme(url):
            raise errors.ApiError(403, Detail.LOCAL_FILES_DISABLED)
        return None
    if not os.path.isfile(url):
        return None
    return _check_local_file(url, limits)


def _has_scheme(url: str) -> bool:
    """Whether urlparse reads a scheme in `url` (only the part before the first "/" is
    parsed: a scheme ends before it, and a malformed host after it cannot raise)."""
    return bool(urlsplit(url.partition("/")[0]).scheme)


def _check_local_file(path: str, limits: Limits) -> str:
    """E8; the file's real path. Containment is a real path-component check (the reference's
    plain prefix test also admits sibling folders such as safe_media_x); the safe folder is
    never created."""
    try:
        real = os.path.realpath(path)
        safe = os.path.realpath(limits.safe_media_path)
        inside = os.path.commonpath([real, safe]) == safe
    except (OSError, ValueError):
        inside = False
    if not inside:
        raise bad(Detail.INVALID_FILE_PATH)
    return real


async def check_remote_url(url: str, limits: Limits, *, lookup: bool = True) -> None:
    """E9–E13 in the reference's order (E11 skipped with allow_private_media_urls), every
    address judged by `is_public`. A host known without a lookup is judged at once: an IP
    literal, localhost (loopback) and .invalid names (E12); a host that ends in a number but
    is not a dotted quad is refused (E11 when the address it reads as is private, else E13).
    Other names are looked up through `Limits.fetcher` (the downloads' resolver, which vets
    every address it connects to again) when `lookup`, else not checked further."""
    try:
        parsed = urlparse(url)
        if parsed.scheme not in ("http", "https"):
            raise bad(Detail.URL_SCHEME)
        hostname = parsed.hostname
        if not hostname:
            raise bad(Detail.URL_HOSTNAME)
        port = parsed.port
        hostname.encode("idna")  # what getaddrinfo does first: its error is the reference's E13
        addresses = _known_addresses(hostname, limits)
        if addresses is None:
            if not lookup:
                return
            addresses = await _look_up(hostname, port, limits)
    except errors.ApiError:
        raise
    except Exception as exc:  # the reference reports any other failure as E13
        raise bad(Detail.URL_OTHER.format(error=exc)) from exc
    if not all(_allowed(address, limits) for address in addresses):
        raise bad(Detail.URL_PRIVATE)


def _allowed(address: IPAddress, limits: Limits) -> bool:
    return limits.allow_private_media_urls or is_public(address)


def _known_addresses(hostname: str, limits: Limits) -> list[IPAddress] | None:
    """The addresses `hostname` names without a lookup (None: it needs one). RFC 6761's
    special names are never looked up: localhost is loopback, a .invalid name resolves to
    nothing (E12)."""
    try:
        address = literal_address(hostname)
    except NumericHost as exc:
        if exc.address is not None and not _allowed(exc.address, limits):
            raise bad(Detail.URL_PRIVATE) from None
        raise
    if address is not None:
        return [address]
    name = hostname.rstrip(".")
    if name == "localhost" or name.endswith(".localhost"):
        return [ipaddress.IPv4Address("127.0.0.1")]
    if name == "invalid" or name.endswith(".invalid"):
        raise bad(Detail.URL_UNRESOLVABLE.format(host=hostname))
    return None


async def _look_up(hostname: str, port: int | None, limits: Limits) -> list[IPAddress]:
    """Every address `hostname` resolves to: through the fetcher (on its loop, with its
    resolver and time limit), or getaddrinfo on this loop's executor without one; E12 when
    it does not resolve."""
    try:
        if limits.fetcher is None:
            infos = await asyncio.get_running_loop().getaddrinfo(hostname, port)
            found = [str(info[4][0]) for info in infos]
        else:
            found = await limits.fetcher.addresses(hostname)
    except OSError:
        raise bad(Detail.URL_UNRESOLVABLE.format(host=hostname)) from None
    return [ipaddress.ip_address(address) for address in found]


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
    check_media_count(len(sources), limits)
    tasks = [asyncio.ensure_future(_read(source, limits)) for source in sources]
    try:
        return [await task for task in tasks]
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def check_media_count(count: int, limits: Limits) -> None:
    """400 for a request with `count` media, more than max_media_items."""
    if count > limits.max_media_items:
        raise bad(Detail.TOO_MANY_MEDIA.format(count=count, limit=limits.max_media_items))


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
