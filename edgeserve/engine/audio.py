"""Reading an audio clip's header before llama.cpp sees a byte of it. Runs on prepare threads.

libmtmd's helper (mtmd_helper_bitmap_init_from_buf) routes a file by its first bytes: RIFF…WAVE,
fLaC, ID3 or an MPEG sync is audio, anything else goes to stb_image. Its miniaudio (0.11.25,
built without Vorbis, so no Ogg) tries its WAV, FLAC and MP3 decoders in turn, asks the one that
opens the file for its length resampled to the projector's rate (ma_decoder_get_length_in_pcm_
frames), and zero-fills a float buffer of that many frames before it decodes a sample. That
length is the header's word: WAV's data chunk, FLAC's STREAMINFO total, an MP3's Xing or Info
frame count (its frames walked when it has none); a header that lies picks the allocation
(2^36 frames throw std::bad_alloc through C code, and the process aborts).

So a clip is taken only when its header is read here, and only in a shape the decoder of its
own kind opens (another decoder never scans it for frames), with a length the file's size
bounds: a WAV's data chunk must fit in the file; a FLAC total (0 means unknown: refused) can be
no more than its largest block times the frames its bytes could hold; an MP3 must be MPEG layer
III frames back to back from its ID3 tag (if any) to its end (a last ID3v1 tag aside), counted
here, and a Xing or Info count above that is refused. `AudioClip.frames_at` is then an upper
bound on the helper's buffer (exact for WAV and FLAC), held to --max-media-tokens by
`check_length`.
"""

from __future__ import annotations

import hashlib
import struct
from dataclasses import dataclass

from edgeserve.errors import InvalidMedia

MIN_SAMPLE_RATE = 8_000
MAX_SAMPLE_RATE = 384_000  # dr_wav's own limit
MAX_CHANNELS = 8
# Shorter clips make some of libmtmd's preprocessors assert (an abort), e.g. one sample.
MIN_SECONDS = 0.1
# `check_length` lets a clip last up to this many times the budget over the projector's
# measured tokens per second: the measure may include a padded chunk (whisper's 30 s), so the
# bound is generous, never short; the exact count is checked after tokenizing, before encoding.
BUDGET_MARGIN = 2
# No FLAC frame is shorter: a 6-byte header, one subframe of at least 2 bytes, a 2-byte CRC.
MIN_FLAC_FRAME_BYTES = 10

_WAV_BITS = {1: (8, 16, 24, 32), 3: (32, 64), 6: (8,), 7: (8,)}  # PCM, float, A-law, µ-law
_WAV_EXTENSIBLE = 0xFFFE
_FLAC_APPLICATION = 2
_MP3_KBPS = {  # layer III bit rates by index: MPEG-1, then MPEG-2 and 2.5
    True: (0, 32, 40, 48, 56, 64, 80, 96, 112, 128, 160, 192, 224, 256, 320),
    False: (0, 8, 16, 24, 32, 40, 48, 56, 64, 80, 96, 112, 128, 144, 160),
}
_MP3_HZ = (44100, 48000, 32000)
_XING_TAGS = (b"Xing", b"Info")


@dataclass(frozen=True)
class AudioInput:
    """What a projector makes of audio: the sample rate it resamples clips to, and the media
    tokens one second of audio takes (measured by tokenizing a silent clip)."""

    sample_rate: int
    tokens_per_second: float


@dataclass(frozen=True)
class AudioClip:
    """An audio file whose header was read: `frames` is the most its decoder can report at
    `sample_rate`; `digest` the SHA-256 of the file."""

    container: str  # "WAV", "FLAC", "MP3"
    data: bytes
    sample_rate: int
    channels: int
    frames: int
    digest: bytes

    def frames_at(self, rate: int) -> int:
        """`frames` resampled to `rate` as miniaudio counts them
        (ma_calculate_frame_count_after_resampling): the size of the helper's buffer."""
        if rate == self.sample_rate:
            return self.frames
        out = self.frames * rate // self.sample_rate
        back = out * (self.sample_rate % rate) + out * (self.sample_rate // rate) // rate
        return out + 1 if back <= self.frames else out


def read_audio(data: bytes) -> AudioClip:
    """The header of a WAV, FLAC or MP3 file; InvalidMedia for anything else (Ogg included)
    or a header that does not fit the file (see the module docstring)."""
    if len(data) < 12:
        raise InvalidMedia(f"{len(data)} bytes are not an audio file (send WAV, MP3 or FLAC)")
    if data[:4] == b"RIFF" and data[8:12] == b"WAVE":
        return _wav(data)
    if data[:4] == b"fLaC":
        return _flac(data)
    if data[:3] == b"ID3" or (data[0] == 0xFF and data[1] & 0xE0 == 0xE0):
        return _mp3(data)
    if data[:4] == b"OggS":
        raise InvalidMedia(
            "Ogg audio (Vorbis, Opus) cannot be read: llama.cpp's audio decoder takes WAV, "
            "MP3 and FLAC; convert the clip to one of those"
        )
    raise InvalidMedia("the data is not a WAV, MP3 or FLAC file")


def check_length(clip: AudioClip, audio: AudioInput, tokens: int) -> int:
    """The frames the helper will hold for `clip` at the projector's rate; InvalidMedia when
    it lasts under MIN_SECONDS, or longer than `tokens` media tokens could hold (with
    BUDGET_MARGIN: this bounds what is decoded, the exact count is the projector's)."""
    frames = clip.frames_at(audio.sample_rate)
    seconds = frames / audio.sample_rate
    if seconds < MIN_SECONDS:
        raise InvalidMedia(
            f"the audio clip lasts {seconds:.3f} s; clips of {MIN_SECONDS} s or more are taken"
        )
    limit = BUDGET_MARGIN * tokens / audio.tokens_per_second
    if seconds > limit:
        raise InvalidMedia(
            f"the audio clip lasts {seconds:.0f} s (from its {clip.container} header), longer "
            f"than the {limit:.0f} s that {tokens} media tokens could hold "
            "(--max-media-tokens); send a shorter clip"
        )
    return frames


def _clip(container: str, data: bytes, rate: int, channels: int, frames: int) -> AudioClip:
    if not MIN_SAMPLE_RATE <= rate <= MAX_SAMPLE_RATE:
        raise InvalidMedia(
            f"the {container} header says {rate} Hz; {MIN_SAMPLE_RATE} to {MAX_SAMPLE_RATE} Hz "
            "are taken"
        )
    if not 1 <= channels <= MAX_CHANNELS:
        raise InvalidMedia(
            f"the {container} header says {channels} channels; 1 to {MAX_CHANNELS} are taken"
        )
    if frames == 0:
        raise InvalidMedia(f"the {container} file holds no samples")
    return AudioClip(
        container, data, rate, channels, frames, hashlib.sha256(b"audio" + data).digest()
    )


def _wav(data: bytes) -> AudioClip:
    """RIFF chunks up to `data` (dr_wav stops there), the last `fmt ` before it read."""
    size = len(data)
    pos = 12
    fmt: tuple[int, int, int] | None = None
    while pos + 8 <= size:
        chunk, length = data[pos : pos + 4], int.from_bytes(data[pos + 4 : pos + 8], "little")
        body = pos + 8
        if chunk == b"data":
            if fmt is None:
                raise InvalidMedia("the WAV file has no fmt chunk before its data")
            if body + length > size:
                raise InvalidMedia(
                    f"the WAV header says its samples take {length} bytes, but the file holds "
                    f"{size - body} after it"
                )
            rate, channels, frame_bytes = fmt
            return _clip("WAV", data, rate, channels, length // frame_bytes)
        end = body + length + (length & 1)
        if end > size:
            raise InvalidMedia(f"the WAV file's {chunk!r} chunk runs past its end")
        if chunk == b"fmt ":
            fmt = _wav_format(data[body : body + length])
        elif chunk == b"fact" and length < 4:
            raise InvalidMedia("the WAV file's fact chunk is too short")
        pos = end
    raise InvalidMedia("the WAV file has no data chunk")


def _wav_format(fmt: bytes) -> tuple[int, int, int]:
    """A WAV fmt chunk's sample rate, channels and bytes per frame, for the encodings taken
    (PCM, float, A-law, µ-law, plain or WAVE_FORMAT_EXTENSIBLE)."""
    if len(fmt) < 16 or 16 < len(fmt) < 18:
        raise InvalidMedia(f"the WAV file's fmt chunk has {len(fmt)} bytes")
    tag, channels, rate, _, align, bits = struct.unpack_from("<HHIIHH", fmt)
    extra = int.from_bytes(fmt[16:18], "little") if len(fmt) > 16 else 0
    if tag == _WAV_EXTENSIBLE:
        if extra != 22 or len(fmt) < 40:
            raise InvalidMedia("the WAV file's extensible fmt chunk is malformed")
        tag = int.from_bytes(fmt[24:26], "little")
    elif 18 + extra > max(len(fmt), 18):
        raise InvalidMedia("the WAV file's fmt chunk is malformed")
    if bits not in _WAV_BITS.get(tag, ()):
        raise InvalidMedia(
            f"WAV encoding {tag} at {bits} bits is not taken; send 8, 16, 24 or 32-bit PCM "
            "or 32-bit float"
        )
    frame_bytes = bits // 8 * channels
    if channels == 0 or align != frame_bytes:
        raise InvalidMedia(
            f"the WAV header's block size {align} does not fit {channels} x {bits} bits"
        )
    return rate, channels, frame_bytes


def _flac(data: bytes) -> AudioClip:
    """STREAMINFO (first, 34 bytes) and the metadata blocks after it, each within the file."""
    size = len(data)
    if size < 42 or data[5:8] != b"\x00\x00\x22" or data[4] & 0x7F != 0:
        raise InvalidMedia("the FLAC file does not start with a STREAMINFO block")
    last = data[4] & 0x80
    max_block = int.from_bytes(data[10:12], "big")
    props = int.from_bytes(data[18:26], "big")
    rate, channels, total = props >> 44, ((props >> 41) & 7) + 1, props & (1 << 36) - 1
    pos = 42
    while not last:
        if pos + 4 > size:
            raise InvalidMedia("the FLAC file ends inside its metadata")
        last, kind, length = (
            data[pos] & 0x80,
            data[pos] & 0x7F,
            int.from_bytes(data[pos + 1 : pos + 4], "big"),
        )
        if kind == _FLAC_APPLICATION and length < 4:
            raise InvalidMedia("the FLAC file has a malformed APPLICATION block")
        pos += 4 + length
        if pos > size:
            raise InvalidMedia("a FLAC metadata block runs past the end of the file")
    if total == 0:
        raise InvalidMedia(
            "the FLAC header does not say how many samples the clip holds; re-encode it"
        )
    if max_block < 16:
        raise InvalidMedia(f"the FLAC header's largest block is {max_block} samples")
    room = (size - pos) // MIN_FLAC_FRAME_BYTES * max_block
    if total > room:
        raise InvalidMedia(
            f"the FLAC header says the clip holds {total} samples, more than its "
            f"{size - pos} bytes of frames can ({room})"
        )
    return _clip("FLAC", data, rate, channels, total)


def _mp3(data: bytes) -> AudioClip:
    """MPEG layer III frames back to back over the stream dr_mp3 reads: after one ID3v2 tag,
    before a last 128-byte ID3v1 tag."""
    start = 0
    if data[:3] == b"ID3":
        start = 10 + sum(
            (b & 0x7F) << shift for b, shift in zip(data[6:10], (21, 14, 7, 0), strict=True)
        )
        start += 10 if data[5] & 0x10 else 0
    end = len(data)
    if end > 128 and data[end - 128 : end - 125] == b"TAG":
        end -= 128
    if end > 32 and data[end - 32 : end - 24] == b"APETAGEX":
        raise InvalidMedia("MP3 files with an APE tag are not taken; remove the tag")
    if end - start < 4:
        raise InvalidMedia("the MP3 file holds no frames after its ID3 tag")
    tags = _xing_positions(data, start, end)
    first = data[start + 1 : start + 3]
    mpeg1 = bool(first[0] & 0x08)
    frames, pos, most = 0, start, 0
    lengths: dict[bytes, int] = {}
    while pos < end:
        header = data[pos : pos + 4]
        length = lengths.get(header[:3])
        if length is None:
            length = lengths[header[:3]] = _mp3_frame_bytes(header, first)
        if length == 0 or pos + length > end:
            raise InvalidMedia(
                f"the MP3 data is broken at byte {pos}: not a whole MPEG layer III frame like "
                "the first"
            )
        tag = pos + 4 + (0 if header[1] & 1 else 2) + _side_info_bytes(mpeg1, header[3])
        if tag in tags:
            most = max(most, _xing_frames(data, tag))
        frames += 1
        pos += length
    if most > frames:
        raise InvalidMedia(
            f"the MP3's Xing/Info header says it holds {most} frames, but it has {frames}"
        )
    rate = _MP3_HZ[first[1] >> 2 & 3] >> (not mpeg1) >> (not first[0] & 0x10)
    return _clip(
        "MP3",
        data,
        rate,
        1 if data[start + 3] & 0xC0 == 0xC0 else 2,
        frames * (1152 if mpeg1 else 576),
    )


def _mp3_frame_bytes(header: bytes, first: bytes) -> int:
    """The length of the frame `header` starts (padding included): 0 unless it is a layer
    III header dr_mp3 takes (free format refused) of the version and rate of `first`."""
    if len(header) < 4 or header[0] != 0xFF:
        return 0
    b1, b2 = header[1], header[2]
    if not (b1 & 0xF0 == 0xF0 or b1 & 0xFE == 0xE2) or (b1 >> 1) & 3 != 1:
        return 0
    if (b1 ^ first[0]) & 0xFE or (b2 ^ first[1]) & 0x0C or b2 >> 2 & 3 == 3:
        return 0
    mpeg1 = bool(b1 & 0x08)
    kbps = _MP3_KBPS[mpeg1][b2 >> 4] if b2 >> 4 != 15 else 0
    if kbps == 0:
        return 0
    rate = _MP3_HZ[b2 >> 2 & 3] >> (not mpeg1) >> (not b1 & 0x10)
    return (1152 if mpeg1 else 576) * kbps * 125 // rate + (1 if b2 & 2 else 0)


def _xing_frames(data: bytes, tag: int) -> int:
    """The frame count of the Xing or Info tag at `tag`; 0 when it gives none."""
    if tag + 12 > len(data):
        raise InvalidMedia("the MP3 file ends inside its Xing/Info header")
    return int.from_bytes(data[tag + 8 : tag + 12], "big") if data[tag + 7] & 1 else 0


def _side_info_bytes(mpeg1: bool, mode: int) -> int:
    mono = mode & 0xC0 == 0xC0
    return (17 if mono else 32) if mpeg1 else (9 if mono else 17)


def _xing_positions(data: bytes, start: int, end: int) -> set[int]:
    """Where "Xing" or "Info" occurs in data[start:end] (where a frame's tag would start)."""
    found: set[int] = set()
    for tag in _XING_TAGS:
        at = data.find(tag, start, end)
        while at >= 0:
            found.add(at)
            at = data.find(tag, at + 1, end)
    return found
