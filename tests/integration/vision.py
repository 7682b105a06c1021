"""What the vision tests share: test images, a conversation with one, and llama.cpp's own
path for it (libmtmd's positions, and `mtmd_helper_eval_chunks` on a fresh context), run in
the test."""

from __future__ import annotations

import contextlib
import ctypes
import io
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import llama_cpp as lc
import llama_cpp.mtmd_cpp as mtmd
import numpy as np
from PIL import Image

from edgeserve.engine.llama.model import MAX_UBATCH
from edgeserve.engine.types import MEDIA_MARKER, ChatPrompt, ChatTurn, Media
from tests.fixtures.lora_reference import GENERATION_FLASH_ATTN


def image_bytes(seed: int, size: tuple[int, int] = (64, 48), fmt: str = "PNG") -> bytes:
    """A random image (`size` is width, height) in a file format."""
    rng = np.random.default_rng(seed)
    pixels = rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, fmt)
    return out.getvalue()


def image_turn(text_before: str, data: bytes, text_after: str) -> ChatTurn:
    """A user message with one image between two texts."""
    return ChatTurn("user", f"{text_before}{MEDIA_MARKER}{text_after}", (Media("image", data),))


@contextlib.contextmanager
def _mtmd_chunks(
    model_path: Path, projector_path: Path, rendered: str, images: list[bytes], n_threads: int
) -> Iterator[tuple[Any, Any, Any, list[int | None]]]:
    """llama.cpp's model, libmtmd's context and its chunks for a rendered chat whose images
    stand at edgeserve's marker (libmtmd decodes the files with stb_image and tokenizes the
    text with its own marker), and the positions' token ids (None for a media position); all
    freed after."""
    model = lc.llama_model_load_from_file(str(model_path).encode(), lc.llama_model_default_params())
    params = mtmd.mtmd_context_params_default()
    params.use_gpu = False
    params.n_threads = n_threads
    params.print_timings = False
    ctx_mm = mtmd.mtmd_init_from_file(str(projector_path).encode(), model, params)
    chunks = mtmd.mtmd_input_chunks_init()
    bitmaps = []
    try:
        for data in images:
            buf = (ctypes.c_uint8 * len(data)).from_buffer_copy(data)
            bitmaps.append(mtmd.mtmd_helper_bitmap_init_from_buf(ctx_mm, buf, len(data), False))
        text = mtmd.mtmd_input_text()
        marked = rendered.replace(MEDIA_MARKER, mtmd.mtmd_default_marker().decode()).encode()
        text.text, text.text_len = marked, len(marked)
        text.add_special, text.parse_special = False, True
        array = (ctypes.c_void_p * len(bitmaps))(*bitmaps)
        assert mtmd.mtmd_tokenize(ctx_mm, chunks, ctypes.byref(text), array, len(bitmaps)) == 0
        ids: list[int | None] = []
        for i in range(mtmd.mtmd_input_chunks_size(chunks)):
            chunk = mtmd.mtmd_input_chunks_get(chunks, i)
            count = ctypes.c_size_t()
            if mtmd.mtmd_input_chunk_get_type(chunk) == 0:
                tokens = mtmd.mtmd_input_chunk_get_tokens_text(chunk, ctypes.byref(count))
                ids += [tokens[j] for j in range(count.value)]
            else:
                ids += [None] * mtmd.mtmd_input_chunk_get_n_tokens(chunk)
        yield model, ctx_mm, chunks, ids
    finally:
        for bitmap in bitmaps:
            mtmd.mtmd_bitmap_free(bitmap)
        mtmd.mtmd_input_chunks_free(chunks)
        mtmd.mtmd_free(ctx_mm)
        lc.llama_model_free(model)


def llama_cpp_positions(
    model_path: Path, projector_path: Path, rendered: str, images: list[bytes]
) -> list[int | None]:
    """llama.cpp's positions for a rendered chat whose images stand at edgeserve's marker:
    their token ids, None for a media position (libmtmd's tokenizer, nothing decoded)."""
    with _mtmd_chunks(model_path, projector_path, rendered, images, 1) as (*_, ids):
        return ids


def llama_cpp_logits(
    model_path: Path,
    projector_path: Path,
    rendered: str,
    images: list[bytes],
    *,
    n_ctx: int,
    n_seq: int,
    n_batch: int,
    n_threads: int,
) -> tuple[list[int | None], np.ndarray]:
    """llama.cpp's own answer for a rendered chat whose images stand at edgeserve's marker:
    libmtmd's chunks (`_mtmd_chunks`), then `mtmd_helper_eval_chunks` decodes every chunk on
    a fresh context (sequence 0), logits for the last position. Returns the positions' token
    ids (None for a media position) and the last logit row."""
    with _mtmd_chunks(model_path, projector_path, rendered, images, n_threads) as (
        model,
        ctx_mm,
        chunks,
        ids,
    ):
        cparams = lc.llama_context_default_params()
        cparams.n_ctx = n_ctx
        cparams.n_batch = n_batch
        cparams.n_ubatch = min(n_batch, MAX_UBATCH)
        cparams.n_seq_max = n_seq
        cparams.n_threads = cparams.n_threads_batch = n_threads
        cparams.kv_unified = True
        cparams.swa_full = True
        cparams.flash_attn_type = GENERATION_FLASH_ATTN  # as the engine's default
        ctx = lc.llama_init_from_model(model, cparams)
        try:
            n_past = lc.llama_pos(0)
            rc = mtmd.mtmd_helper_eval_chunks(
                ctx_mm, ctx, chunks, 0, 0, n_batch, True, ctypes.byref(n_past)
            )
            assert rc == 0 and n_past.value == len(ids)
            n_vocab = lc.llama_vocab_n_tokens(lc.llama_model_get_vocab(model))
            row = np.ctypeslib.as_array(lc.llama_get_logits_ith(ctx, -1), shape=(n_vocab,))
            return ids, row.copy()
        finally:
            lc.llama_free(ctx)


def chat(*turns: ChatTurn) -> ChatPrompt:
    """A conversation of these turns."""
    return ChatPrompt(tuple(turns))
