"""`[models.NAME]` tables of the TOML config: one catalogue entry each, holding the per-model
settings that exist as server-wide ones (see README "Several models")."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

from edgeserve.config import values

# The keys a preset may hold, each with its parser: the server-wide settings of the same
# name, plus what only a catalogue entry has.
_PARSERS: dict[str, Any] = {
    "model": values.text,
    "mmproj": values.text,
    "draft_model": values.text,
    "embedding_model": values.text,
    "lora": values.lora_adapters,
    "ctx_size": values.integer(0),
    "parallel": values.integer(1),
    "n_gpu_layers": values.integer(-1),
    "chat_template": values.text,
    "aliases": lambda raw: values.names(raw),
    "keep_alive": lambda raw: values.keep_alive(raw),
    "load_at_start": values.boolean,
    "pinned": values.boolean,
}
_PATHS = ("model", "mmproj", "draft_model", "embedding_model")
_KEY_NAMES = {"path": "model"}  # llama-server's presets call the file `model` too


@dataclass(frozen=True)
class ModelPreset:
    """One `[models.NAME]` table; None for a setting it leaves to the server-wide value."""

    name: str
    model: str | None = None
    mmproj: str | None = None
    draft_model: str | None = None
    embedding_model: str | None = None
    lora: tuple[tuple[str, str], ...] | None = None
    ctx_size: int | None = None
    parallel: int | None = None
    n_gpu_layers: int | None = None
    chat_template: str | None = None
    aliases: tuple[str, ...] = ()
    keep_alive: float | None = None
    load_at_start: bool = False
    pinned: bool = False

    def rebased(self, base: Path) -> ModelPreset:
        """The preset with relative file paths taken relative to `base` (the config file's
        folder)."""
        moved: dict[str, Any] = {}
        for key in _PATHS:
            value = getattr(self, key)
            if value is not None:
                moved[key] = str(base / Path(value).expanduser())
        if self.lora is not None:
            moved["lora"] = tuple((n, str(base / Path(p).expanduser())) for n, p in self.lora)
        return replace(self, **moved)


def model_presets(raw: object) -> tuple[ModelPreset, ...]:
    """`[models.NAME]` tables (a TOML table of tables) as presets, in file order."""
    if not isinstance(raw, Mapping):
        raise ValueError("must be a table of [models.NAME] tables")
    presets = []
    known = {f.name for f in fields(ModelPreset)} - {"name"}
    for name, table in raw.items():
        values.names(name)  # one name without spaces
        if not isinstance(table, Mapping):
            raise ValueError(f"has models.{name}, which is not a table")
        found: dict[str, Any] = {}
        for key, value in table.items():
            field_name = _KEY_NAMES.get(key.replace("-", "_"), key.replace("-", "_"))
            if field_name not in known:
                raise ValueError(f"has models.{name}.{key}, which is not a per-model setting")
            try:
                found[field_name] = _PARSERS[field_name](value)
            except ValueError as exc:
                raise ValueError(f"has models.{name}.{key} {value!r}: it {exc}") from None
        presets.append(ModelPreset(name=name, **found))
    return tuple(presets)
