"""Images: the same chat request with one image (a PNG data URL) to edgeserve `--mmproj` (and
its baseline) and to llama-server `--mmproj`, same model, projector and image.

Each of `requests` rounds makes a new image (640×480 random pixels, seeded by the round, the
same image for every server), so that no server has it cached; every server, in an order that
rotates each round, takes the request cold, then the very same request again (the repeated
image: the prefix cache's case). One request runs at a time (`--parallel 1`). Per server: the
time to the first content token of each (streamed; the request's upload included), the
generated tokens/s after it (end-of-generation banned: exactly max_tokens tokens), the prompt
tokens and, of the repeats, the cached ones. The report gives edgeserve / llama-server (the
target: a cold TTFT of at most 1.0×) and, with a baseline, edgeserve / previous.

The projector is by default the tiny random-weights Gemma 3 one the tests use
(tests/fixtures/tiny_projector.py: the image is resized to 32×32 and becomes 4 positions),
written next to the results; it fits the default model only (640-wide embeddings). Give a
real model's with the bench's --mmproj. A server whose `--help` has no `--mmproj` (an
edgeserve from before images) is not started and shows "n/a", as does one that does not start
with the projector or refuses the image; the reason is kept in the results.
"""

from __future__ import annotations

import asyncio
import base64
import random
import re
import statistics
import struct
import subprocess
import zlib
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from bench import load
from bench.anchors import EDGESERVE, EDGESERVES, LLAMA_SERVER, Setup, server_env
from bench.turns import rotated

WIDTH, HEIGHT = 640, 480
# The photo sent beside a running text stream: a camera's size, decoded and encoded by the
# server while the stream runs (target: the stream never waits 1 s for a token).
PHOTO_WIDTH, PHOTO_HEIGHT = 4000, 3000
STREAM_TOKENS = 400
# Sequences each server runs: the photo request beside the stream needs a second one.
PARALLEL = 2
PROMPT = "Describe this picture in a few sentences."
# Image seeds: round r uses r; the warm-up one is apart from every round's.
WARM_UP_SEED = 1_000_000
# The servers this workload runs (in the bench's order).
KINDS = (*EDGESERVES, LLAMA_SERVER)
PROJECTOR_NAME = "tiny-gemma3-mmproj.gguf"
MS = 1000.0


def png_bytes(width: int, height: int, seed: int) -> bytes:
    """An RGB PNG of `width`×`height` random pixels, the same for the same seed (standard
    library only: the pixels do not compress, so every server decodes the full size)."""
    rng = random.Random(seed)
    raw = b"".join(b"\x00" + rng.randbytes(3 * width) for _ in range(height))
    return png_from_rows(width, height, raw)


def png_from_rows(width: int, height: int, raw: bytes) -> bytes:
    """An 8-bit RGB PNG of `raw` (each row led by its filter byte)."""

    def chunk(tag: bytes, data: bytes) -> bytes:
        body = tag + data
        return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(raw))
        + chunk(b"IEND", b"")
    )


def photo_png(width: int, height: int) -> bytes:
    """A smooth `width`×`height` gradient as a PNG: all its pixels to decode, few bytes to send."""
    red = bytes(x * 255 // max(1, width - 1) for x in range(width))
    rows = []
    for y in range(height):
        row = bytearray(3 * width)
        row[0::3] = red
        row[1::3] = bytes([y * 255 // max(1, height - 1)]) * width
        row[2::3] = b"\x80" * width
        rows.append(b"\x00" + bytes(row))
    return png_from_rows(width, height, b"".join(rows))


def data_url(png: bytes) -> str:
    """The PNG as a `data:image/png;base64,…` URL."""
    return "data:image/png;base64," + base64.b64encode(png).decode("ascii")


def messages(image_url: str, text: str = PROMPT) -> list[dict[str, Any]]:
    """One user message: the image, then the question (OpenAI content parts)."""
    content = [
        {"type": "image_url", "image_url": {"url": image_url}},
        {"type": "text", "text": text},
    ]
    return [{"role": "user", "content": content}]


def offers_mmproj(help_text: str) -> bool:
    """Whether a server's `--help` lists the `--mmproj` flag itself (not only longer flags
    that start with it, such as llama-server's --mmproj-url)."""
    return re.search(r"--mmproj(?![\w-])", help_text) is not None


def help_command(kind: str, setup: Setup) -> list[str]:
    """The command that prints a server's flags."""
    if kind in EDGESERVES:
        binary = setup.edgeserve if kind == EDGESERVE else setup.baseline
        return [str(binary), "serve", "--help"]
    if kind == LLAMA_SERVER:
        return [str(setup.llamacpp_bin / "llama-server"), "--help"]
    raise ValueError(f"{kind} does not take images here")


def lacks_flag(kind: str, setup: Setup, offered: Callable[[str], bool], reason: str) -> str | None:
    """`reason` when `kind`'s `--help` does not offer a flag (`offered`, given the help text),
    the failure when it cannot be read; None when it offers it."""
    cmd = help_command(kind, setup)
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=server_env())
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"{cmd[0]} --help failed: {exc}"
    return None if offered(proc.stdout + proc.stderr) else reason


def missing_mmproj(kind: str, setup: Setup) -> str | None:
    """Why `kind` cannot serve images; None when its `--help` has `--mmproj`."""
    return lacks_flag(kind, setup, offers_mmproj, "no --mmproj (a version without images)")


def start_failure(error: str) -> str:
    """A server's failed start in one line: the error's first line and the log's last."""
    lines = [line.strip() for line in error.splitlines() if line.strip()]
    if not lines:
        return "did not start"
    last = f" {lines[-1]}" if len(lines) > 1 else ""
    return f"did not start: {lines[0]}{last}"


def projector(given: Path | None, out: Path) -> Path:
    """The projector to serve: `given`, else the tests' tiny Gemma 3 one written into `out`."""
    if given is not None:
        return given
    from tests.fixtures.tiny_projector import write_tiny_projector  # needs the gguf package

    out.mkdir(parents=True, exist_ok=True)
    path = out / PROJECTOR_NAME
    write_tiny_projector(path)
    return path


def _median(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return float(statistics.median(present)) if present else None


def _ms(value: float | None) -> float | None:
    return None if value is None else value * MS


def summarize(cold: list[load.Stream], repeated: list[load.Stream]) -> dict[str, Any]:
    """One server's figures: each round's and their medians (times in ms)."""
    ttft = [_ms(s.ttft) for s in cold]
    repeat_ttft = [_ms(s.ttft) for s in repeated]
    decode = [s.decode_tps for s in cold]
    both = cold + repeated
    return {
        "requests": len(cold),
        "ttft_ms": ttft,
        "ttft_p50_ms": _median(ttft),
        "repeat_ttft_ms": repeat_ttft,
        "repeat_ttft_p50_ms": _median(repeat_ttft),
        "decode_tps": decode,
        "decode_tps_p50": _median(decode),
        "prompt_tokens": _median([_num(s.prompt_tokens) for s in cold]),
        "repeat_cached_tokens": _median([_num(s.cached_tokens) for s in repeated]),
        "short": sum(s.short for s in both),
        "errors": [s.error for s in both if s.error][:5],
    }


def _num(value: int | None) -> float | None:
    return None if value is None else float(value)


async def warm_up(
    url: str, kind: str, width: int, height: int, eog_ids: Sequence[int]
) -> str | None:
    """One short image request (lazy initialisation is not measured); the error, if any."""
    image = messages(data_url(png_bytes(width, height, WARM_UP_SEED)))
    body = load.chat_body(kind, image, 4, eog_ids)
    async with load.session() as http:
        stream = await load.stream_chat(http, url, body)
    if stream.error:
        return stream.error
    if stream.ttft is None:
        return "no content streamed"
    return None


async def compare(
    pair: list[tuple[str, str]],
    requests: int,
    max_tokens: int,
    width: int,
    height: int,
    eog_ids: Sequence[int],
) -> dict[str, dict[str, Any]]:
    """Each server in `pair` ((kind, url), ...) takes each round's new image cold, then again,
    the servers taking turns (the model's `eog_ids` banned); per kind, `summarize`'s figures."""
    cold: dict[str, list[load.Stream]] = {kind: [] for kind, _ in pair}
    repeated: dict[str, list[load.Stream]] = {kind: [] for kind, _ in pair}
    async with load.session() as http:
        for rnd in range(requests):
            body_messages = messages(data_url(png_bytes(width, height, rnd)))
            for kind, url in rotated(pair, rnd):
                body = load.chat_body(kind, body_messages, max_tokens, eog_ids)
                cold[kind].append(await load.stream_chat(http, url, body))
                repeated[kind].append(await load.stream_chat(http, url, body))
    return {kind: summarize(cold[kind], repeated[kind]) for kind, _ in pair}


async def photo_beside_stream(
    url: str, kind: str, photo: bytes, eog_ids: Sequence[int]
) -> dict[str, Any]:
    """A long text stream runs; a second after it starts, `photo` is sent. The stream's
    longest wait for a token, the photo request's own time to first token and any error."""
    story = [{"role": "user", "content": "Tell a long story about a lighthouse."}]
    async with load.session() as http:
        stream = asyncio.ensure_future(
            load.stream_chat(http, url, load.chat_body(kind, story, STREAM_TOKENS, eog_ids))
        )
        await asyncio.sleep(1.0)
        image = await load.stream_chat(
            http, url, load.chat_body(kind, messages(data_url(photo)), 4, eog_ids)
        )
        text = await stream
    return {
        "max_gap_s": max(text.gaps, default=None),
        "photo_ttft_s": image.ttft,
        "error": image.error or text.error,
    }
