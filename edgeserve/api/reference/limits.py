"""What the endpoints' checks share: the server's `Limits` (and the reference's env parsing
they follow), the 400 factory `bad`, the Unicode check, and the prompt list of completions and
embeddings."""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from edgeserve import errors
from edgeserve.api.reference.detail import Detail
from edgeserve.api.reference.fetcher import MediaFetcher
from edgeserve.engine.types import MediaKind, TokenPrompt


def is_env_enabled(environ: Mapping[str, str], key: str, default: str = "0") -> bool:
    """The reference's boolean env parsing: enabled iff the value is true, y or 1 (any case)."""
    return environ.get(key, default).lower() in ("true", "y", "1")


def default_safe_media_path(environ: Mapping[str, str]) -> str:
    """$XDG_CACHE_HOME/edgeserve/safe_media, else ~/.cache/edgeserve/safe_media."""
    cache = environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.abspath(os.path.join(cache, "edgeserve", "safe_media"))


@dataclass(frozen=True, kw_only=True)
class Limits:
    """What this server accepts in one request.

    max_tokens caps max_tokens/max_completion_tokens (None: only the context window limits it).
    allow_local_files/safe_media_path follow the reference's env variables; see from_env.
    media_kinds are the media the model takes besides text (default none; the HTTP layer sets
    them from the loaded model's), max_media_* bound a request's media, and `fetcher` downloads
    media URLs (None: a media URL is a 400), from public addresses only unless
    allow_private_media_urls.
    """

    max_n: int = 16
    max_tokens: int | None = None
    allow_local_files: bool = True
    safe_media_path: str = field(default_factory=lambda: default_safe_media_path(os.environ))
    media_kinds: frozenset[MediaKind] = frozenset()
    max_media_items: int = 8
    max_media_bytes: int = 20 * 1024 * 1024
    allow_private_media_urls: bool = False
    fetcher: MediaFetcher | None = None
    max_score_texts: int = 256
    max_embed_inputs: int = 2048  # OpenAI's own limit

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> Limits:
        """Read ALLOW_LOCAL_FILES (default enabled) and SAFE_MEDIA_PATH.

        An unset or empty SAFE_MEDIA_PATH means default_safe_media_path(environ). The folder is
        never created here. Other fields keep their defaults; use dataclasses.replace for them.
        The reference's *_PLACEHOLDER variables are not read: a media item reaches the engine
        as the item itself, never as placeholder text.
        """
        return cls(
            allow_local_files=is_env_enabled(environ, "ALLOW_LOCAL_FILES", "1"),
            safe_media_path=os.path.abspath(
                environ.get("SAFE_MEDIA_PATH") or default_safe_media_path(environ)
            ),
        )


def bad(detail: str) -> errors.ApiError:
    """A 400 with `detail`."""
    return errors.ApiError(400, detail)


def prompt_list(
    prompt: str | list[str] | list[int] | list[list[int]],
) -> tuple[tuple[str | TokenPrompt, ...], bool]:
    """The prompts, and whether the request sent a single one (a string or one list of token
    ids) rather than a list of them."""
    if isinstance(prompt, str):
        return (prompt,), True
    if prompt and isinstance(prompt[0], int):
        return (TokenPrompt(tuple(prompt)),), True
    return tuple(p if isinstance(p, str) else TokenPrompt(tuple(p)) for p in prompt), False


def check_unicode(texts: Iterable[tuple[str, str | None]]) -> None:
    """400 for text the tokenizer and the response encoder cannot take (lone surrogates)."""
    for where, text in texts:
        if text is not None and not _is_encodable(text):
            raise bad(Detail.BAD_UNICODE.format(where=where))


def check_unicode_values(values: Iterable[tuple[str, Any]]) -> None:
    """400 for JSON values (strings and keys at any depth) that hold a lone surrogate: the
    fields a response repeats to the client, whose encoder cannot take them."""
    for where, value in values:
        if not _is_encodable(json.dumps(value, ensure_ascii=False)):
            raise bad(Detail.BAD_UNICODE.format(where=where))


def _is_encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True
