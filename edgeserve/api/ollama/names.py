"""Model names as Ollama's clients write them: checked on every Ollama route, even with one
model (a client learns that a model is missing from the 404), a `:latest` tag naming the
untagged model; listed with `:latest` where a name has no tag, as Ollama lists them."""

from __future__ import annotations

from collections.abc import Collection
from typing import Any, Final

from edgeserve.api.reference.detail import Detail
from edgeserve.api.reference.limits import bad
from edgeserve.errors import ApiError

LATEST: Final = ":latest"


def served_name(requested: Any, served: Collection[str]) -> str:
    """The served name `requested` names: itself, or itself without a `:latest` tag; 400
    without a name, Ollama's 404 for a name this server does not serve."""
    if not isinstance(requested, str) or not requested:
        raise bad(Detail.OLLAMA_MODEL_REQUIRED)
    for name in (requested, requested.removesuffix(LATEST)):
        if name in served:
            return name
    raise ApiError(404, Detail.OLLAMA_MODEL_NOT_FOUND.format(name=requested))


def listed_name(name: str) -> str:
    """A model's name as /api/tags and /api/ps list it: tagged `:latest` when it has no tag."""
    return name if ":" in name else name + LATEST
