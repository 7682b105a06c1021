"""What Ollama's model routes say about a model, from its GGUF file's header (read without
loading the model, kept while the file is unchanged) and the catalogue's state: /api/tags'
and /api/ps' entries and /api/show's answer."""

from __future__ import annotations

import functools
import hashlib
import os
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final

from edgeserve.api.ollama.names import listed_name
from edgeserve.api.ollama.options import DEFAULTS
from edgeserve.catalogue.gguf_header import ArrayLength, GgufError, read_metadata
from edgeserve.catalogue.status import ModelState

# llama.cpp's llama_ftype values (general.file_type) by name, the common ones.
FILE_TYPES: Final = {
    0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 7: "Q8_0", 8: "Q5_0", 9: "Q5_1", 10: "Q2_K",
    11: "Q3_K_S", 12: "Q3_K_M", 13: "Q3_K_L", 14: "Q4_K_S", 15: "Q4_K_M", 16: "Q5_K_S",
    17: "Q5_K_M", 18: "Q6_K", 19: "IQ2_XXS", 20: "IQ2_XS", 21: "Q2_K_S", 22: "IQ3_XS",
    23: "IQ3_XXS", 24: "IQ1_S", 25: "IQ4_NL", 26: "IQ3_S", 27: "IQ3_M", 28: "IQ2_S",
    29: "IQ2_M", 30: "IQ4_XS", 31: "IQ1_M", 32: "BF16", 36: "TQ1_0", 37: "TQ2_0", 38: "MXFP4",
}  # fmt: skip
NEVER: Final = "2318-01-01T00:00:00Z"
"""The `expires_at` of a model that stays loaded (pinned, in use, or kept with keep_alive < 0),
a far-off time as Ollama writes one."""


@functools.lru_cache(maxsize=64)
def _header(path: str, signature: tuple[int, int]) -> dict[str, Any]:
    """The GGUF header of `path` as it is at `signature` (size, mtime)."""
    return read_metadata(path)


def gguf_facts(path: str) -> tuple[dict[str, Any], int, float]:
    """The model file's metadata (empty when it cannot be read), size in bytes and mtime."""
    try:
        found = os.stat(path)
        metadata = _header(path, (found.st_size, found.st_mtime_ns))
    except (OSError, GgufError):
        return {}, 0, 0.0
    return metadata, found.st_size, found.st_mtime


def go_time(seconds: float) -> str:
    """Unix seconds as Go writes a UTC time."""
    return datetime.fromtimestamp(seconds, UTC).isoformat().replace("+00:00", "Z")


def details(metadata: dict[str, Any]) -> dict[str, Any]:
    """Ollama's `details`: format, family, parameter size, quantization."""
    family = str(metadata.get("general.architecture", ""))
    file_type = metadata.get("general.file_type")
    return {
        "parent_model": "",
        "format": "gguf",
        "family": family,
        "families": [family] if family else None,
        "parameter_size": str(metadata.get("general.size_label", "")),
        "quantization_level": FILE_TYPES.get(file_type, str(file_type or "")),
    }


def tags_entry(state: ModelState) -> dict[str, Any]:
    """A model of GET /api/tags (`digest`: a hash of the file's path, size and mtime, not of
    its bytes)."""
    metadata, size, mtime = gguf_facts(state.path)
    name = listed_name(state.id)
    digest = hashlib.sha256(f"{state.path}:{size}:{mtime}".encode()).hexdigest()
    return {
        "name": name,
        "model": name,
        "modified_at": go_time(mtime),
        "size": size,
        "digest": digest,
        "details": details(metadata),
    }


def ps_entry(state: ModelState) -> dict[str, Any]:
    """A loaded model of GET /api/ps: its memory (measured, else estimated), when it unloads
    and its context."""
    entry = tags_entry(state)
    del entry["modified_at"]
    expires = NEVER if state.expires_at is None else go_time(state.expires_at)
    size = state.measured or state.estimated or entry["size"]
    return entry | {
        "size": size,
        "expires_at": expires,
        "size_vram": 0,
        "context_length": state.n_ctx,
    }


def show_body(state: ModelState, template: str | None) -> dict[str, Any]:
    """POST /api/show: the model's chat template, sampling defaults, details and its GGUF
    metadata (arrays, such as the vocabulary, as null; the template in `template`)."""
    metadata, _, mtime = gguf_facts(state.path)
    chat_template = template or str(metadata.get("tokenizer.chat_template", ""))
    info = {
        key: None if isinstance(value, ArrayLength) else value
        for key, value in metadata.items()
        if key != "tokenizer.chat_template"
    }
    capabilities = ["completion", "tools"] + (["vision"] if "image" in state.media_kinds else [])
    parameters = "\n".join(f"{name:<30} {value:g}" for name, value in DEFAULTS.items())
    return {
        "license": str(metadata.get("general.license", "")),
        "modelfile": f"# edgeserve's model {state.id}\nFROM {Path(state.path).name}\n",
        "parameters": parameters,
        "template": chat_template,
        "details": details(metadata),
        "model_info": info,
        "capabilities": capabilities,
        "modified_at": go_time(mtime),
    }
