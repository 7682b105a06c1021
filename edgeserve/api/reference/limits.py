"""What the endpoints' checks share: the server's `Limits` (and the reference's env parsing
they follow), the 400 factory `bad`, the Unicode check, and the prompt list of completions and
embeddings."""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from edgeserve import errors
from edgeserve.api.reference.detail import Detail
from edgeserve.engine.types import TokenPrompt


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
    allow_local_files/safe_media_path/placeholders follow the reference's env variables; see
    from_env. The accepts_* flags say which media the model takes (default: text only).
    """

    max_n: int = 16
    max_tokens: int | None = None
    allow_local_files: bool = True
    safe_media_path: str = field(default_factory=lambda: default_safe_media_path(os.environ))
    accepts_images: bool = False
    accepts_video: bool = False
    accepts_audio: bool = False
    max_score_texts: int = 256
    max_embed_inputs: int = 2048  # OpenAI's own limit
    image_placeholder: str = "<image>"
    video_placeholder: str = "<video>"
    audio_placeholder: str = "<audio>"

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> Limits:
        """Read ALLOW_LOCAL_FILES (default enabled), SAFE_MEDIA_PATH and the *_PLACEHOLDER names.

        An unset or empty SAFE_MEDIA_PATH means default_safe_media_path(environ). The folder is
        never created here. Other fields keep their defaults; use dataclasses.replace for them.
        """
        return cls(
            allow_local_files=is_env_enabled(environ, "ALLOW_LOCAL_FILES", "1"),
            safe_media_path=os.path.abspath(
                environ.get("SAFE_MEDIA_PATH") or default_safe_media_path(environ)
            ),
            image_placeholder=environ.get("IMAGE_PLACEHOLDER", "<image>"),
            video_placeholder=environ.get("VIDEO_PLACEHOLDER", "<video>"),
            audio_placeholder=environ.get("AUDIO_PLACEHOLDER", "<audio>"),
        )

    def accepts(self, kind: str) -> bool:
        """Whether the model takes media items of `kind` (image_url, video_url, audio_url)."""
        return {
            "image_url": self.accepts_images,
            "video_url": self.accepts_video,
            "audio_url": self.accepts_audio,
        }[kind]

    def placeholder(self, kind: str) -> str:
        """The text that stands for one media item of `kind` in the flattened content."""
        return {
            "image_url": self.image_placeholder,
            "video_url": self.video_placeholder,
            "audio_url": self.audio_placeholder,
        }[kind]


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


def _is_encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True
