"""Errors that cross layer boundaries.

    ApiError(status, detail, headers)      a client-visible HTTP error: {"detail": ...}
      (built only by edgeserve.api: each API's checks, with the strings of api.reference.detail)

    EngineError                            the engine's base class (never a client's fault)
      ├── EngineOverloaded                 the admission queue is full
      ├── EngineStopped                    the engine is draining or stopped
      ├── EngineLoading                    the model is still loading
      ├── EngineFault                      serving this one request failed (a bug: 500)
      ├── EngineRestarted                  the context was made anew under this request (503)
      ├── PromptTooLong(n_prompt, n_ctx)   a prompt that cannot fit in the context (n_prompt
      │                                    may be a lower bound, at_least)
      ├── RequestTooLarge(what, got, limit) a request over a configured engine limit
      ├── MediaTooLarge(positions)         a media item over what the request has left
      ├── UnknownToken(position, token)    a token id outside the model's vocabulary
      ├── InvalidPrompt(message)           the chat template refused the conversation
      │     └── InvalidMedia(message)      an image or clip that cannot be read or is too big
      ├── UnknownAdapter(name)             a LoRA adapter that is not loaded (any more)
      ├── AdapterInUse(name)               an adapter to unload that requests still run under
      ├── AdapterRefused(rule, name, path) a LoRA adapter that may not be loaded at run time
      ├── InvalidAdapter(message)          a LoRA file that is not an adapter of the model
      ├── UnknownModel(name, available)    a model the catalogue does not have
      ├── ModelUnavailable(reason, retry)  a catalogue model that cannot be loaded now
      └── ModelRefused(reason)             a model file POST /models/load may not load

No module here imports aiohttp, so every layer may use these.
"""

from __future__ import annotations

from typing import Any, Literal

AdapterRule = Literal[
    "name_taken", "no_folder", "outside_folder", "not_a_file", "file_loaded", "full", "not_lora"
]


class ApiError(Exception):
    """A client-visible error: HTTP status plus the `detail` value of the JSON body."""

    def __init__(
        self,
        status: int,
        detail: Any,
        headers: dict[str, str] | None = None,
        code: str | None = None,
    ) -> None:
        super().__init__(f"{status}: {detail}")
        self.status = status
        self.detail = detail
        self.headers = headers or {}
        self.code = code  # OpenAI's error code (`model_not_found`), where one applies


class EngineError(Exception):
    """Base class for errors raised by the engine."""


class EngineOverloaded(EngineError):
    """The engine's admission queue is full."""


class EngineStopped(EngineError):
    """The engine is shutting down and admits no new work."""


class EngineLoading(EngineError):
    """The model is still loading: nothing can be served yet."""


class EngineFault(EngineError):
    """Serving one request failed inside the engine; the other requests go on."""


class EngineRestarted(EngineError):
    """The engine made its context anew (after a broken decode) while running this request."""


class PromptTooLong(EngineError):
    """A prompt (plus what it must generate) does not fit in the context window.

    With `at_least`, `n_prompt` is a lower bound found without tokenizing the whole prompt.
    """

    def __init__(
        self, n_prompt: int, n_ctx: int, index: int | None = None, *, at_least: bool = False
    ) -> None:
        super().__init__(f"prompt of {n_prompt} tokens does not fit a context of {n_ctx}")
        self.n_prompt = n_prompt
        self.n_ctx = n_ctx
        self.index = index
        self.at_least = at_least

    @property
    def count(self) -> str:
        """The token count as a message shows it ("at least N" for a lower bound)."""
        return f"at least {self.n_prompt}" if self.at_least else str(self.n_prompt)


class RequestTooLarge(EngineError):
    """A request exceeds a configured engine limit (texts per request, tokens per request)."""

    def __init__(self, what: str, got: int, limit: int) -> None:
        super().__init__(f"{what}: {got} exceeds the limit of {limit}")
        self.what = what
        self.got = got
        self.limit = limit


class MediaTooLarge(EngineError):
    """A media item takes more positions than its request has left of --max-media-tokens:
    known once the projector has tokenized it, before anything is encoded."""

    def __init__(self, positions: int) -> None:
        super().__init__(f"the media item takes {positions} positions")
        self.positions = positions


class UnknownToken(EngineError):
    """A token id that is not in the vocabulary: at `position` in a token prompt (of text
    `index` in a score request)."""

    def __init__(self, position: int, token: int, n_vocab: int, index: int | None = None) -> None:
        super().__init__(f"token id {token} at position {position} is not in the vocabulary")
        self.position = position
        self.token = token
        self.n_vocab = n_vocab
        self.index = index


class InvalidPrompt(EngineError):
    """The conversation cannot be turned into a prompt (the chat template refused it)."""


class InvalidMedia(InvalidPrompt):
    """An image or audio clip that cannot be read (not an image, truncated, too many pixels),
    or media the model does not take; the message says which item and why."""


class UnknownAdapter(EngineError):
    """A request names a LoRA adapter that is not loaded (or was unloaded since)."""

    def __init__(self, name: str) -> None:
        super().__init__(f"the adapter {name} is not loaded")
        self.name = name


class AdapterInUse(EngineError):
    """An adapter to unload that live requests still run under."""

    def __init__(self, name: str, requests: int) -> None:
        super().__init__(f"the adapter {name} is in use by {requests} request(s)")
        self.name = name
        self.requests = requests


class AdapterRefused(EngineError):
    """A LoRA adapter that may not be loaded at run time as `name`, by `rule` (see
    engine/adapters.py): `path` is the path as the client sent it, `loaded_as` the name the
    same file is loaded under (rule "file_loaded"), `limit` the most adapters loaded at once
    (rule "full"). It carries no byte of the file and no word of llama.cpp's."""

    def __init__(
        self, rule: AdapterRule, name: str, path: str, *, loaded_as: str = "", limit: int = 0
    ) -> None:
        super().__init__(f"the LoRA adapter {name} ({path}) is refused: {rule}")
        self.rule = rule
        self.name = name
        self.path = path
        self.loaded_as = loaded_as
        self.limit = limit


class InvalidAdapter(EngineError):
    """A LoRA file that cannot be loaded as an adapter of the served model (not a LoRA GGUF,
    another architecture, tensor shapes that do not match); the message has llama.cpp's
    reason, for the operator (the log, a refused start), never for a client."""


class UnknownModel(EngineError):
    """A request named a model the catalogue does not have."""

    def __init__(self, name: str | None, available: list[str]) -> None:
        super().__init__(f"unknown model {name!r}")
        self.name = name
        self.available = available


class ModelUnavailable(EngineError):
    """A catalogue model that cannot serve now: it failed to load, or no room can be made for
    it; retry after `retry_after` seconds."""

    def __init__(self, reason: str, retry_after: int) -> None:
        super().__init__(reason)
        self.reason = reason
        self.retry_after = retry_after


class ModelRefused(EngineError):
    """A request to load a model file that may not or cannot be loaded (400)."""
