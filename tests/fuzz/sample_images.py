"""Small valid images of every format the server reads, in several modes (the seeds that the
image fuzzing mutates), made with Pillow once per process."""

from __future__ import annotations

import base64
import functools
import io

from PIL import Image


def _encode(image: Image.Image, fmt: str, **options: object) -> bytes:
    out = io.BytesIO()
    image.save(out, fmt, **options)
    return out.getvalue()


def _gradient(mode: str, size: tuple[int, int] = (5, 3)) -> Image.Image:
    image = Image.new("RGB", size)
    image.putdata(
        [(x * 50 % 256, y * 80 % 256, (x + y) * 30 % 256) for y in range(3) for x in range(5)]
    )
    return image.convert(mode)


@functools.cache
def sample_images() -> dict[str, bytes]:
    """Valid files by name: PNG (RGB, RGBA, palette, grey, 16-bit, interlaced), JPEG (RGB,
    grey, CMYK, progressive), GIF (two frames), BMP (RGB, palette), WebP (lossy, lossless,
    animated)."""
    rgb = _gradient("RGB")
    frames = [rgb, _gradient("RGB").rotate(180)]
    return {
        "png": _encode(rgb, "PNG"),
        "png-rgba": _encode(_gradient("RGBA"), "PNG"),
        "png-palette": _encode(_gradient("P"), "PNG"),
        "png-grey": _encode(_gradient("L"), "PNG"),
        "png-16bit": _encode(_gradient("I;16"), "PNG"),
        "png-interlaced": _encode(rgb, "PNG", interlace=1),
        "jpeg": _encode(rgb, "JPEG"),
        "jpeg-grey": _encode(_gradient("L"), "JPEG"),
        "jpeg-cmyk": _encode(_gradient("CMYK"), "JPEG"),
        "jpeg-progressive": _encode(rgb, "JPEG", progressive=True),
        "gif": _encode(frames[0], "GIF", save_all=True, append_images=frames[1:]),
        "bmp": _encode(rgb, "BMP"),
        "bmp-palette": _encode(_gradient("P"), "BMP"),
        "webp": _encode(rgb, "WEBP"),
        "webp-lossless": _encode(rgb, "WEBP", lossless=True),
        "webp-animated": _encode(frames[0], "WEBP", save_all=True, append_images=frames[1:]),
    }


def png_data_url() -> str:
    """The RGB PNG as a data URL."""
    return "data:image/png;base64," + base64.b64encode(sample_images()["png"]).decode()
