"""Fuzzing the media decoders without a model: base64 payloads and data URIs
(api/common/media.py) and image files (engine/images.py), from valid PNG, JPEG, GIF, BMP and
WebP files with their bytes cut, changed, inserted or doubled, and from bytes of no format.
A data URI passes or gets a 4xx ApiError; an image decodes to as many RGB bytes as its size
says, or is refused with InvalidMedia; nothing else may escape."""

from __future__ import annotations

import asyncio
import base64
import struct
import zlib

from hypothesis import example, given
from hypothesis import strategies as st

from edgeserve.api.common.media import decode_base64, flatten
from edgeserve.api.common.wire import MultimodalInputItem
from edgeserve.api.reference.limits import Limits
from edgeserve.engine.images import decode_image
from edgeserve.errors import ApiError, InvalidMedia
from tests.fuzz.budget import fuzz_settings
from tests.fuzz.json_strategies import corrupted, pick
from tests.fuzz.sample_images import sample_images

BASE64_CHARS = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/="
MIME_TYPES = [
    "image/png",
    "image/jpeg",
    "image/jpg",
    "image/gif",
    "image/bmp",
    "image/webp",
    "image/svg+xml",
    "IMAGE/PNG",
    "audio/wav",
    "video/mp4",
    "",
]


def _png_chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def _huge_png(width: int, height: int) -> bytes:
    """A PNG whose header claims `width` x `height` (its data is one empty row)."""
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + _png_chunk(b"IHDR", header)
        + _png_chunk(b"IDAT", zlib.compress(b"\x00"))
        + _png_chunk(b"IEND", b"")
    )


payloads = st.one_of(
    pick(list(sample_images().values())).map(lambda data: base64.b64encode(data).decode()),
    st.text(st.sampled_from(BASE64_CHARS), max_size=40),
    st.text(max_size=40),
    st.sampled_from(["", "=", "====", "A", "AA==", "A===", "\x00", "\ud800", "%41%41", " AAAA "]),
)
images = st.one_of(
    pick(list(sample_images().values())).flatmap(corrupted).flatmap(corrupted),
    st.binary(max_size=64),
    pick(list(sample_images().values())).map(lambda data: data[: len(data) // 3]),
    st.tuples(st.integers(0, 2**31 - 1), st.integers(0, 2**31 - 1)).map(lambda wh: _huge_png(*wh)),
)


@fuzz_settings(300)
@given(payload=payloads)
@example(payload="\ud800")
def test_base64_decodes_to_bytes_or_none(payload: str) -> None:
    data = decode_base64(payload)
    assert data is None or (isinstance(data, bytes) and data)


@fuzz_settings(200)
@given(
    mime=st.sampled_from(MIME_TYPES),
    payload=payloads,
    separator=st.sampled_from([";base64,", ";base64,,", ",", ";charset=utf-8;base64,", ";BASE64,"]),
    item_type=st.sampled_from(["image_url", "audio_url", "video_url"]),
    images_taken=st.booleans(),
)
def test_data_uris_pass_or_get_a_client_error(
    mime: str, payload: str, separator: str, item_type: str, images_taken: bool
) -> None:
    url = f"data:{mime}{separator}{payload}"
    item = MultimodalInputItem.model_validate({"type": item_type, item_type: {"url": url}})
    limits = Limits(
        allow_local_files=False, media_kinds=frozenset({"image"} if images_taken else ())
    )
    try:
        asyncio.run(flatten([item], 0, limits, [], lookups=True))
    except ApiError as err:
        assert 400 <= err.status < 500, err


@fuzz_settings(400)
@given(data=images, max_pixels=st.sampled_from([1, 15, 10_000, 40_000_000]))
@example(data=_huge_png(2**31 - 1, 2**31 - 1), max_pixels=40_000_000)
@example(data=_huge_png(0, 5), max_pixels=40_000_000)
def test_images_decode_or_are_refused_as_invalid_media(data: bytes, max_pixels: int) -> None:
    try:
        image = decode_image(data, max_pixels)
    except InvalidMedia as exc:
        assert str(exc)
        return
    assert 0 < image.width * image.height <= max_pixels
    assert len(image.rgb) == image.width * image.height * 3


def test_every_sample_image_decodes() -> None:
    """The seeds are valid (else the mutations start from refusals)."""
    for name, data in sample_images().items():
        image = decode_image(data, 100)
        assert (image.width, image.height) == (5, 3), name
