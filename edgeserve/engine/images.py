"""Reading an image a client sent: its size from the header first (a decompression bomb is
refused before any pixel is decoded), then its pixels as RGB (first frame of an animation,
transparency dropped). Runs on prepare threads.

Pillow is imported when a projector that takes images loads (`pillow`), not with the engine:
a server of a text-only model never decodes an image, and Pillow costs ~2 MiB of resident
memory to import."""

from __future__ import annotations

import functools
import hashlib
import io
from dataclasses import dataclass
from types import ModuleType

from edgeserve.errors import InvalidMedia

FORMATS = ("PNG", "JPEG", "GIF", "BMP", "WEBP")


@dataclass(frozen=True)
class DecodedImage:
    """An image as rows of RGB bytes, and the SHA-256 of the file they came from (hashing the
    file, not the pixels: a camera photo's file is a hundredth of its pixels)."""

    width: int
    height: int
    rgb: bytes
    digest: bytes


@functools.cache
def pillow() -> ModuleType:
    """Pillow's Image module, imported on the first call (the projector makes it when it
    loads, so that the first image pays no import). The pixel limit is --max-media-pixels,
    checked by `decode_image` from the header before any decoding, in place of Pillow's own
    process-wide one."""
    from PIL import Image

    Image.MAX_IMAGE_PIXELS = None
    return Image


def decode_image(data: bytes, max_pixels: int) -> DecodedImage:
    """The pixels of a PNG, JPEG, GIF, BMP or WebP file; InvalidMedia for anything else, a
    truncated file, or one of more than `max_pixels` pixels (checked before decoding)."""
    if not data:
        raise InvalidMedia("the image is empty")
    image_module = pillow()
    try:
        image = image_module.open(io.BytesIO(data), formats=FORMATS)
        width, height = image.size
        if width * height > max_pixels:
            raise InvalidMedia(
                f"the image is {width}x{height} pixels, more than the limit of "
                f"{max_pixels} (--max-media-pixels)"
            )
        if width == 0 or height == 0:
            raise InvalidMedia("the image has no pixels")
        image.seek(0)
        rgb = image if image.mode == "RGB" else image.convert("RGB")
        digest = hashlib.sha256(b"image" + data).digest()
        return DecodedImage(width, height, rgb.tobytes(), digest)
    except InvalidMedia:
        raise
    except image_module.UnidentifiedImageError:
        raise InvalidMedia("the data is not an image of a known format") from None
    except (OSError, ValueError, SyntaxError) as exc:  # truncated or corrupt data
        raise InvalidMedia(f"the image could not be decoded: {exc}") from None
