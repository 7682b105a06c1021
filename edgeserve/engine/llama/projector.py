"""The multimodal projector (`--mmproj`) through llama.cpp's libmtmd.

libmtmd turns an image (or an audio clip, where the projector has an audio encoder) into the
model's input: the tokens that frame it (`<start_of_image>` … `<end_of_image>` for Gemma 3)
and one embedding row per position it takes. This runs on prepare threads, one item at a time
(the mtmd context is not thread-safe); the engine thread decodes the rows into a sequence
(`LlamaBackend.decode_media`). llama-cpp-python's own chat handlers cannot be used: they
reset the context and decode into sequence 0.

An item reaches libmtmd only as Pillow's pixels (engine/images.py) or as an audio file whose
header engine/audio.py read, its length held to the request's media tokens here, before the
helper allocates its samples; it is tokenized first, and encoded only once all its positions
fit.
"""

from __future__ import annotations

import contextlib
import ctypes
import threading
from collections.abc import Iterator
from typing import Any

import llama_cpp.llama_cpp as lc
import numpy as np

from edgeserve.engine.audio import AudioClip, AudioInput, check_length
from edgeserve.engine.images import DecodedImage, pillow
from edgeserve.engine.llama.native_log import native_log_callback
from edgeserve.engine.ports import MediaEmbeddings
from edgeserve.engine.types import MediaKind
from edgeserve.errors import InvalidMedia, MediaTooLarge

_TEXT_CHUNK = 0  # MTMD_INPUT_CHUNK_TYPE_TEXT
# The silent clip whose tokens measure a projector's tokens per second: whisper's chunk.
PROBE_SECONDS = 30


class ProjectorLoadError(RuntimeError):
    """The projector could not be loaded beside this model."""


def _mtmd() -> Any:
    """llama-cpp-python's libmtmd binding (its import loads the library)."""
    try:
        import llama_cpp.mtmd_cpp as mtmd
    except (OSError, FileNotFoundError) as exc:
        raise ProjectorLoadError(
            "this llama-cpp-python build has no libmtmd (built with LLAVA_BUILD=OFF); "
            "rebuild it with `make install`"
        ) from exc
    return mtmd


class Projector:
    """A loaded projector beside `model`: what it takes (`kinds`) and `encode`."""

    def __init__(self, path: str, model: Any, *, n_threads: int, use_gpu: bool) -> None:
        mtmd = _mtmd()
        mtmd.mtmd_helper_log_set(native_log_callback(), ctypes.c_void_p(0))
        params = mtmd.mtmd_context_params_default()
        params.use_gpu = use_gpu
        params.n_threads = n_threads
        params.print_timings = False
        ctx = mtmd.mtmd_init_from_file(path.encode(), model, params)
        if not ctx:
            width = lc.llama_model_n_embd_inp(model)
            raise ProjectorLoadError(
                f"llama.cpp could not load the projector {path}: not a multimodal projector "
                f"GGUF, or made for another model (this model's embeddings are {width} wide)"
            )
        if mtmd.mtmd_decode_use_mrope(ctx):
            mtmd.mtmd_free(ctx)
            raise ProjectorLoadError(
                f"the projector {path} needs M-RoPE positions (Qwen2-VL family), which "
                "edgeserve does not support"
            )
        self._mtmd = mtmd
        self._ctx = ctx
        self._lock = threading.Lock()
        self.width = lc.llama_model_n_embd_inp(model)
        kinds: set[MediaKind] = set()
        if mtmd.mtmd_support_vision(ctx):
            kinds.add("image")
            pillow()  # imported now rather than by the first image
        self.audio: AudioInput | None = None
        if mtmd.mtmd_support_audio(ctx):
            kinds.add("audio")
            self.audio = self._measure_audio(path)
        self.kinds = frozenset(kinds)

    def encode(
        self, media: DecodedImage | AudioClip, max_positions: int
    ) -> list[list[int] | MediaEmbeddings]:
        """An image's RGB pixels (or an audio file read by engine/audio.py) as the model reads
        it: text tokens and embeddings, in order. InvalidMedia when libmtmd cannot read or
        encode it, or a clip lasts longer than `max_positions` could hold; MediaTooLarge
        when it takes more than `max_positions` positions (before it is encoded)."""
        mtmd = self._mtmd
        with self._lock:
            bitmap = self._bitmap(media, max_positions)
            try:
                mtmd.mtmd_bitmap_set_id(bitmap, media.digest.hex().encode())
                with self._tokenized(bitmap) as chunks:
                    positions = self._positions(chunks)
                    if positions > max_positions:
                        raise MediaTooLarge(positions)
                    return [self._piece(chunk, media.digest) for chunk in chunks]
            finally:
                mtmd.mtmd_bitmap_free(bitmap)

    def _measure_audio(self, path: str) -> AudioInput:
        """The projector's sample rate, and the media tokens a second of audio takes: a silent
        clip of PROBE_SECONDS tokenized (its mel spectrogram made, nothing encoded), so every
        projector type counts as it will count a clip. Whisper pads a clip by a 30 s chunk,
        so the measure may be twice the rate (engine/audio.py's margin allows for it)."""
        mtmd = self._mtmd
        rate = mtmd.mtmd_get_audio_sample_rate(self._ctx)
        n = PROBE_SECONDS * rate
        bitmap = mtmd.mtmd_bitmap_init_from_audio(n, (ctypes.c_float * n)())
        try:
            with self._tokenized(bitmap) as chunks:
                positions = self._positions(chunks)
        except InvalidMedia:
            positions = 0
        finally:
            mtmd.mtmd_bitmap_free(bitmap)
        if positions == 0:
            self.close()
            raise ProjectorLoadError(f"the projector {path} could not tokenize a silent clip")
        return AudioInput(rate, positions / PROBE_SECONDS)

    def _bitmap(self, media: DecodedImage | AudioClip, max_positions: int) -> Any:
        mtmd = self._mtmd
        if isinstance(media, DecodedImage):
            # a pointer into the bytes (no copy: libmtmd copies the pixels itself)
            pixels = ctypes.cast(ctypes.c_char_p(media.rgb), ctypes.POINTER(ctypes.c_ubyte))
            return mtmd.mtmd_bitmap_init(media.width, media.height, pixels)
        if self.audio is None:
            raise InvalidMedia("this projector takes no audio")
        # The helper sizes its sample buffer from the header: held to the budget first.
        check_length(media, self.audio, max_positions)
        data = (ctypes.c_uint8 * len(media.data)).from_buffer_copy(media.data)
        bitmap = mtmd.mtmd_helper_bitmap_init_from_buf(self._ctx, data, len(data), False)
        if bitmap and not mtmd.mtmd_bitmap_is_audio(bitmap):
            mtmd.mtmd_bitmap_free(bitmap)
            bitmap = None
        if not bitmap:
            raise InvalidMedia(f"the {media.container} clip could not be decoded")
        return bitmap

    @contextlib.contextmanager
    def _tokenized(self, bitmap: Any) -> Iterator[list[Any]]:
        """The chunks libmtmd makes of one item: the text that frames it and its positions
        (mtmd_tokenize: an image is resized, a clip's mel spectrogram made; no encoding)."""
        mtmd = self._mtmd
        chunks = mtmd.mtmd_input_chunks_init()
        try:
            marker = mtmd.mtmd_default_marker()
            text = mtmd.mtmd_input_text()
            text.text, text.text_len = marker, len(marker)
            text.add_special, text.parse_special = False, True
            bitmaps = (ctypes.c_void_p * 1)(bitmap)
            if mtmd.mtmd_tokenize(self._ctx, chunks, ctypes.byref(text), bitmaps, 1) != 0:
                raise InvalidMedia("the projector could not take this media item")
            yield [
                mtmd.mtmd_input_chunks_get(chunks, i)
                for i in range(mtmd.mtmd_input_chunks_size(chunks))
            ]
        finally:
            mtmd.mtmd_input_chunks_free(chunks)

    def _positions(self, chunks: list[Any]) -> int:
        """The positions the media chunks among `chunks` take."""
        mtmd = self._mtmd
        return sum(
            mtmd.mtmd_input_chunk_get_n_tokens(chunk)
            for chunk in chunks
            if mtmd.mtmd_input_chunk_get_type(chunk) != _TEXT_CHUNK
        )

    def _piece(self, chunk: Any, digest: bytes) -> list[int] | MediaEmbeddings:
        mtmd = self._mtmd
        if mtmd.mtmd_input_chunk_get_type(chunk) == _TEXT_CHUNK:
            count = ctypes.c_size_t()
            tokens = mtmd.mtmd_input_chunk_get_tokens_text(chunk, ctypes.byref(count))
            return [tokens[i] for i in range(count.value)]
        n = mtmd.mtmd_input_chunk_get_n_tokens(chunk)
        if mtmd.mtmd_encode_chunk(self._ctx, chunk) != 0:
            raise InvalidMedia("the projector failed to encode this media item")
        rows = mtmd.mtmd_get_output_embd(self._ctx)
        embeddings = np.ctypeslib.as_array(rows, shape=(n * self.width,)).reshape(n, self.width)
        return MediaEmbeddings(
            embeddings.copy(), mtmd.mtmd_decode_use_non_causal(self._ctx, chunk), digest
        )

    def close(self) -> None:
        """Free the mtmd context."""
        if self._ctx:
            self._mtmd.mtmd_free(self._ctx)
            self._ctx = None
