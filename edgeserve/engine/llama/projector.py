"""The multimodal projector (`--mmproj`) through llama.cpp's libmtmd.

libmtmd turns an image (or an audio clip, where the projector has an audio encoder) into the
model's input: the tokens that frame it (`<start_of_image>` … `<end_of_image>` for Gemma 3)
and one embedding row per position it takes. This runs on prepare threads, one item at a time
(the mtmd context is not thread-safe); the engine thread decodes the rows into a sequence
(`LlamaBackend.decode_media`). llama-cpp-python's own chat handlers cannot be used: they
reset the context and decode into sequence 0.
"""

from __future__ import annotations

import ctypes
import threading
from typing import Any

import llama_cpp as lc
import numpy as np

from edgeserve.engine.images import DecodedImage
from edgeserve.engine.llama.native_log import native_log_callback
from edgeserve.engine.ports import MediaEmbeddings
from edgeserve.engine.types import MediaKind
from edgeserve.errors import InvalidMedia

_TEXT_CHUNK = 0  # MTMD_INPUT_CHUNK_TYPE_TEXT


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
        if mtmd.mtmd_support_audio(ctx):
            kinds.add("audio")
        self.kinds = frozenset(kinds)

    def encode(
        self, media: DecodedImage | bytes, digest: bytes
    ) -> list[list[int] | MediaEmbeddings]:
        """An image's RGB pixels (or an audio file's bytes) as the model reads it: text tokens
        and embeddings, in order. InvalidMedia when libmtmd cannot read or encode it."""
        mtmd = self._mtmd
        with self._lock:
            bitmap = self._bitmap(media)
            chunks = mtmd.mtmd_input_chunks_init()
            try:
                mtmd.mtmd_bitmap_set_id(bitmap, digest.hex().encode())
                marker = mtmd.mtmd_default_marker()
                text = mtmd.mtmd_input_text()
                text.text, text.text_len = marker, len(marker)
                text.add_special, text.parse_special = False, True
                bitmaps = (ctypes.c_void_p * 1)(bitmap)
                if mtmd.mtmd_tokenize(self._ctx, chunks, ctypes.byref(text), bitmaps, 1) != 0:
                    raise InvalidMedia("the projector could not take this media item")
                return [
                    self._piece(mtmd.mtmd_input_chunks_get(chunks, i), digest)
                    for i in range(mtmd.mtmd_input_chunks_size(chunks))
                ]
            finally:
                mtmd.mtmd_input_chunks_free(chunks)
                mtmd.mtmd_bitmap_free(bitmap)

    def _bitmap(self, media: DecodedImage | bytes) -> Any:
        mtmd = self._mtmd
        if isinstance(media, DecodedImage):
            # a pointer into the bytes (no copy: libmtmd copies the pixels itself)
            pixels = ctypes.cast(ctypes.c_char_p(media.rgb), ctypes.POINTER(ctypes.c_ubyte))
            bitmap = mtmd.mtmd_bitmap_init(media.width, media.height, pixels)
        else:
            data = (ctypes.c_uint8 * len(media)).from_buffer_copy(media)
            bitmap = mtmd.mtmd_helper_bitmap_init_from_buf(self._ctx, data, len(media), False)
            if bitmap and not mtmd.mtmd_bitmap_is_audio(bitmap):
                mtmd.mtmd_bitmap_free(bitmap)
                bitmap = None
        if not bitmap:
            raise InvalidMedia("the audio clip could not be decoded (send WAV, MP3 or FLAC)")
        return bitmap

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
