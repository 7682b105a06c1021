"""engine/audio.py: an audio file's length read from its header and bounded by its size, before
llama.cpp's helper sizes a buffer from it (tests/integration/test_audio_guard.py runs the helper
itself)."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from edgeserve.engine.audio import (
    MIN_FLAC_FRAME_BYTES,
    AudioClip,
    AudioInput,
    check_length,
    read_audio,
)
from edgeserve.errors import InvalidMedia
from tests.fixtures.audio_files import (
    LOW_RATE_HEADER,
    flac_bytes,
    mp3_bytes,
    wav_header_lying,
)
from tests.fixtures.tiny_projector import wav_bytes
from tests.fuzz.budget import fuzz_settings

# The tiny Qwen2-Audio projector's measure: 1500 positions for 30 s of silence.
WHISPER = AudioInput(16000, 50.0)


def refused(data: bytes) -> str:
    with pytest.raises(InvalidMedia) as caught:
        read_audio(data)
    return str(caught.value)


@pytest.mark.parametrize("total", [2**36 - 1, 2**31])
def test_a_42_byte_flac_declaring_billions_of_samples_is_refused(total: int) -> None:
    data = flac_bytes(total=total, frames=False)
    assert len(data) == 42
    assert f"holds {total} samples, more than its 0 bytes of frames can" in refused(data)


def test_a_flac_total_is_bounded_by_its_bytes_and_largest_block() -> None:
    good = flac_bytes(1.0)
    clip = read_audio(good)
    assert (clip.container, clip.sample_rate, clip.channels, clip.frames) == (
        "FLAC",
        16000,
        1,
        16000,
    )
    frame_bytes = len(good) - 42
    most = frame_bytes // MIN_FLAC_FRAME_BYTES * 4096
    assert read_audio(flac_bytes(1.0, total=most)).frames == most
    assert "more than its" in refused(flac_bytes(1.0, total=most + 1))
    assert "does not say how many samples" in refused(flac_bytes(1.0, total=0))


def test_flac_metadata_must_lie_within_the_file() -> None:
    good = flac_bytes(0.5)
    not_last = good[:4] + b"\x00" + good[5:42]  # STREAMINFO not the last block, none after
    assert "ends inside its metadata" in refused(not_last[:42])
    padding = b"\x81\x00\x01\x00" + bytes(256)  # a last PADDING block of 256 bytes
    assert read_audio(not_last + padding + good[42:]).frames == 8000
    assert "runs past the end" in refused(not_last + b"\x81\x01\x00\x00" + good[42:])


def test_a_wav_data_chunk_must_fit_in_the_file() -> None:
    clip = read_audio(wav_bytes(1.0))
    assert (clip.container, clip.sample_rate, clip.frames) == ("WAV", 16000, 16000)
    assert read_audio(wav_header_lying(320)).frames == 160
    message = refused(wav_header_lying(2**32 - 2))
    assert "says its samples take 4294967294 bytes, but the file holds 320" in message
    assert "runs past its end" in refused(wav_bytes(1.0)[:30])  # inside the fmt chunk


def test_wav_encodings_and_chunks() -> None:
    wav = wav_bytes(0.5)
    fmt_at, data_at = wav.index(b"fmt "), wav.index(b"data")
    # an odd-sized chunk (and its pad byte) before the data chunk is skipped
    listed = wav[:data_at] + b"LIST\x03\x00\x00\x00abc\x00" + wav[data_at:]
    assert read_audio(listed).frames == 8000
    # WAVE_FORMAT_EXTENSIBLE with a PCM sub-format
    ext = struct.pack("<HHIIHHHHI", 0xFFFE, 1, 16000, 32000, 2, 16, 22, 16, 4) + b"\x01\x00"
    ext += bytes(14)
    extensible = wav[:fmt_at] + b"fmt " + struct.pack("<I", 40) + ext + wav[data_at:]
    assert read_audio(extensible).frames == 8000
    adpcm = wav[: fmt_at + 8] + struct.pack("<H", 2) + wav[fmt_at + 10 :]
    assert "WAV encoding 2 at 16 bits is not taken" in refused(adpcm)
    bad_align = wav[: fmt_at + 20] + struct.pack("<H", 3) + wav[fmt_at + 22 :]
    assert "block size 3" in refused(bad_align)
    data_first = wav[:12] + wav[data_at:] + wav[fmt_at:data_at]
    assert "no fmt chunk before its data" in refused(data_first)


def test_mp3_frames_are_walked_not_taken_from_a_xing_header() -> None:
    clip = read_audio(mp3_bytes(1.0))
    assert (clip.container, clip.sample_rate, clip.channels) == ("MP3", 32000, 1)
    assert clip.frames == 28 * 1152
    assert read_audio(mp3_bytes(1.0, id3=True)).frames == clip.frames
    assert read_audio(mp3_bytes(1.0, xing_frames=29)).frames == 29 * 1152
    message = refused(mp3_bytes(1.0, xing_frames=2**32 - 1))
    assert "Xing/Info header says it holds 4294967295 frames, but it has 29" in message


def test_mp3_frames_must_run_back_to_back_to_the_end() -> None:
    mp3 = mp3_bytes(1.0)
    tagged = mp3 + b"TAG" + bytes(125)  # an ID3v1 tag at the end is skipped, as dr_mp3 does
    assert read_audio(tagged).frames == read_audio(mp3).frames
    assert "broken at byte 1440" in refused(mp3[:1440] + b"junk" + mp3[1440:])
    assert "broken at byte 3888" in refused(mp3[:-12])  # the last frame cut short
    assert "APE tag" in refused(mp3 + b"APETAGEX" + bytes(24))
    other_rate = mp3[:144] + b"\xff\xfb\x14\xc0" + mp3[148:]  # 48 kHz among 32 kHz frames
    assert "broken at byte 144" in refused(other_rate)
    flac_after_id3 = b"ID3\x04\x00\x00\x00\x00\x00\x00" + flac_bytes(0.5)
    assert "broken at byte 10" in refused(flac_after_id3)
    assert "no frames after its ID3 tag" in refused(b"ID3\x04\x00\x00\x00\x00\x10\x00" + bytes(8))


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"", "0 bytes are not an audio file"),
        (b"\x89PNG\r\n\x1a\n" + bytes(64), "not a WAV, MP3 or FLAC file"),
        (b"GIF89a" + bytes(64), "not a WAV, MP3 or FLAC file"),
        (b"RIFF\x00\x00\x00\x00WEBPVP8 " + bytes(64), "not a WAV, MP3 or FLAC file"),
        (b"OggS" + bytes(64), "Ogg audio (Vorbis, Opus) cannot be read"),
        (b"hello, this is text and not audio", "not a WAV, MP3 or FLAC file"),
    ],
)
def test_what_is_not_a_known_container_is_refused(data: bytes, message: str) -> None:
    assert message in refused(data)


def test_check_length_holds_a_clip_to_the_media_token_budget() -> None:
    hour = read_audio(mp3_bytes(3600, LOW_RATE_HEADER))  # 3.6 MB of 8 kbit/s frames
    with pytest.raises(InvalidMedia) as caught:
        check_length(hour, WHISPER, 4096)
    assert "lasts 3600 s (from its MP3 header), longer than the 164 s" in str(caught.value)
    clip = read_audio(wav_bytes(1.0, rate=44100))
    assert check_length(clip, WHISPER, 4096) == clip.frames_at(16000) == 16000
    # 2 x 100 tokens at 50 a second: 4 s
    assert check_length(read_audio(wav_bytes(4.0)), WHISPER, 100) == 64000
    with pytest.raises(InvalidMedia, match="longer than the 4 s"):
        check_length(read_audio(wav_bytes(4.01)), WHISPER, 100)
    with pytest.raises(InvalidMedia, match=r"lasts 0\.050 s; clips of 0\.1 s or more"):
        check_length(read_audio(wav_bytes(0.05)), WHISPER, 4096)


def test_frames_at_is_miniaudios_resampled_count() -> None:
    def at(rate: int, frames: int, out: int = 16000) -> int:
        return AudioClip("WAV", b"", rate, 1, frames, b"").frames_at(out)

    # ma_calculate_frame_count_after_resampling, worked by hand: out = in * 16000 / rate,
    # plus one when out * (rate % 16000) + out * (rate // 16000) // 16000 <= in
    assert at(44100, 57330) == 20800
    assert at(22050, 55125) == 40000
    assert at(32000, 32256) == 16129
    assert at(8000, 80064) == 160128
    assert at(16000, 12345) == 12345


VALID = [
    wav_bytes(0.2),
    wav_bytes(0.2, rate=44100),
    flac_bytes(0.2),
    mp3_bytes(0.3),
    mp3_bytes(0.3, id3=True),
    mp3_bytes(0.3, xing_frames=9),
    mp3_bytes(0.3, LOW_RATE_HEADER),
]
MAGIC = [b"RIFF\x10\x00\x00\x00WAVE", b"fLaC", b"ID3", b"\xff\xfb", b"\xff\xe3", b"OggS", b""]


def mutated(data: bytes, edits: list[tuple[int, int]], cut: int) -> bytes:
    out = bytearray(data)
    for at, byte in edits:
        out[at % len(out)] = byte
    return bytes(out[: max(0, len(out) - cut)])


@st.composite
def audio_like(draw: st.DrawFn) -> bytes:
    if draw(st.booleans()):
        return draw(st.sampled_from(MAGIC)) + draw(st.binary(max_size=400))
    base = draw(st.sampled_from(VALID))
    head = st.tuples(st.integers(0, 80), st.integers(0, 255))
    anywhere = st.tuples(st.integers(0, len(base) - 1), st.integers(0, 255))
    edits = draw(st.lists(st.one_of(head, anywhere), max_size=6))
    return mutated(base, edits, draw(st.sampled_from([0, 0, 1, 3, 12, 100])))


@fuzz_settings(500)
@given(audio_like())
def test_the_header_reader_refuses_or_bounds_the_length_by_the_file_size(data: bytes) -> None:
    try:
        clip = read_audio(data)
    except InvalidMedia:
        return
    size = len(data)
    # what each container's bytes could hold at most: WAV one byte a frame, MP3 576 samples
    # in 24 bytes (MPEG-2 at 8 kbit/s), FLAC its largest block in every 10 bytes
    most = {"WAV": size, "MP3": 24 * size, "FLAC": size // MIN_FLAC_FRAME_BYTES * 65535}
    assert 0 < clip.frames <= most[clip.container]
    assert 8000 <= clip.sample_rate <= 384000
    assert clip.frames_at(16000) <= clip.frames * 2 + 1  # never more than doubled (8 kHz)
