"""The catalogue: which models a server offers, by id, each with the engine settings it loads
with. Entries come from `--model` (alone: the single-model server), `--models-dir` (a `.gguf`
file is a model named after the file; a sub-folder is one model, named after the folder, with
its `mmproj*.gguf` projector and, for a split model, its first shard) and the config file's
`[models.NAME]` tables (a preset names a file and overrides any per-model setting)."""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from pathlib import Path

from edgeserve.config import Settings
from edgeserve.config.presets import ModelPreset
from edgeserve.engine.types import EngineConfig

# A split model's shards: NAME-00001-of-00003.gguf; llama.cpp opens the first and finds the rest.
_SHARD = re.compile(r"^(?P<name>.+)-(?P<part>\d{5})-of-\d{5}$")


@dataclass(frozen=True)
class ModelEntry:
    """One model the server offers: its id, other names, engine settings, and how long it
    stays loaded when idle (None: the server's --keep-alive)."""

    id: str
    config: EngineConfig
    aliases: tuple[str, ...] = ()
    keep_alive: float | None = None
    load_at_start: bool = False
    pinned: bool = False


class Catalogue:
    """The entries by id and alias. `single`: the server was given --model alone, so every
    request is for that model whatever name it gives (as the reference answers)."""

    def __init__(self, entries: list[ModelEntry], *, single: bool = False) -> None:
        self.entries = {entry.id: entry for entry in entries}
        self.single = single
        self._names: dict[str, str] = {}
        for entry in entries:
            for name in (entry.id, *entry.aliases):
                self._names.setdefault(name, entry.id)

    def resolve(self, name: str | None) -> ModelEntry | None:
        """The entry a request's `model` names (any name, or none, with a single model)."""
        if self.single:
            return next(iter(self.entries.values()))
        if name is None:
            return None
        found = self._names.get(name)
        return None if found is None else self.entries[found]

    def ids(self) -> list[str]:
        """Every entry's id, sorted."""
        return sorted(self.entries)

    def names(self) -> list[str]:
        """Every name a request may give: the ids and the aliases."""
        return list(self._names)


def build_catalogue(settings: Settings) -> Catalogue:
    """The catalogue `settings` describe: --model alone, or the folder's models, the presets
    and --model (when given) together; a preset of a folder model's id overrides it."""
    base = settings.engine_config()
    if not settings.catalogue:
        entry = ModelEntry(id=settings.model_name, config=base, load_at_start=True, pinned=True)
        return Catalogue([entry], single=True)
    entries: dict[str, ModelEntry] = {}
    # --lora, --mmproj, --draft-model and --embedding-model belong to --model's model.
    bare = replace(
        base, lora_adapters=(), mmproj_path=None, draft_model_path=None, embedding_model_path=None
    )
    if settings.model:
        entries[settings.model_name] = ModelEntry(
            id=settings.model_name, config=base, load_at_start=True, pinned=True
        )
    if settings.models_dir:
        for name, (path, mmproj) in scan_models_dir(Path(settings.models_dir)).items():
            config = replace(bare, model_path=str(path), mmproj_path=mmproj and str(mmproj))
            entries.setdefault(name, ModelEntry(id=name, config=config))
    for preset in settings.models:
        entries[preset.name] = preset_entry(preset, bare)
    return Catalogue(list(entries.values()))


def preset_entry(preset: ModelPreset, base: EngineConfig) -> ModelEntry:
    """A `[models.NAME]` table's entry: the server-wide settings, overridden by the preset's."""
    overrides = {
        "model_path": preset.model,
        "mmproj_path": preset.mmproj,
        "draft_model_path": preset.draft_model,
        "embedding_model_path": preset.embedding_model,
        "lora_adapters": preset.lora,
        "n_ctx": preset.ctx_size,
        "parallel": preset.parallel,
        "n_gpu_layers": preset.n_gpu_layers,
        "chat_template": preset.chat_template,
    }
    config = replace(base, **{k: v for k, v in overrides.items() if v is not None})
    return ModelEntry(
        id=preset.name,
        config=config,
        aliases=preset.aliases,
        keep_alive=preset.keep_alive,
        load_at_start=preset.load_at_start,
        pinned=preset.pinned,
    )


def scan_models_dir(folder: Path) -> dict[str, tuple[Path, Path | None]]:
    """Model id -> (model file, projector or None) for each model in `folder`: every `.gguf`
    file at its top (a split model's first shard; `mmproj*` files are projectors, not models),
    and every sub-folder holding a model file (its first, by name) and perhaps a projector."""
    found: dict[str, tuple[Path, Path | None]] = {}
    for path in sorted(folder.iterdir()):
        if path.is_dir():
            files = sorted(p for p in path.glob("*.gguf") if p.is_file())
            models = [p for p in files if not _is_projector(p) and _first_shard(p)]
            projectors = [p for p in files if _is_projector(p)]
            if models:
                found[path.name] = (models[0], projectors[0] if projectors else None)
        elif path.suffix == ".gguf" and path.is_file() and not _is_projector(path):
            shard = _SHARD.match(path.stem)
            if shard is None or int(shard["part"]) == 1:
                found[shard["name"] if shard else path.stem] = (path, None)
    return found


def _is_projector(path: Path) -> bool:
    return path.name.lower().startswith("mmproj")


def _first_shard(path: Path) -> bool:
    """Whether `path` is a whole model or a split model's first shard."""
    shard = _SHARD.match(path.stem)
    return shard is None or int(shard["part"]) == 1
